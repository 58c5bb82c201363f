"""Deploy one host: facts -> plan -> apply -> wait (rollout.py runs it on every host).

All input is read, validated and rendered for every selected host before the first
connection, so a bad file, an unknown profile or a template error changes no host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vigil.deploy import progress, seed
from vigil.deploy import roles as roles_plan
from vigil.deploy.facts import HostFacts, parse_facts
from vigil.deploy.gpucheck import GpuPolicy
from vigil.deploy.hooks import Hooks
from vigil.deploy.plan import Action, ActionKind, Plan, make_plan
from vigil.deploy.preflight import check_host, stale_gpu_processes
from vigil.deploy.runtime import import_remedy, verify_install
from vigil.deploy.seed import Trust
from vigil.desired.render import paths_for
from vigil.desired.targets import Target
from vigil.errors import (
    HostError,
    InternalError,
    PermissionDeniedError,
    ServeError,
    VigilError,
)
from vigil.report import HostResult, HostStatus, Log, failed_word
from vigil.transport.base import Transport
from vigil.transport.lock import host_lock, lock_owner
from vigil.transport.remote import call
from vigil.transport.ssh import connect
from vigil.verify.reducer import Verdict
from vigil.verify.report import Reporter, outcome_json
from vigil.verify.watch import Settings as WatchSettings
from vigil.verify.watch import verify_target


def agent_request(t: Target) -> dict[str, Any]:
    p = t.rendered.paths
    return {
        "unit": t.vars.service,
        "port": t.vars.port,
        "service_user": t.vars.service_user,
        "model": t.profile.path,
        "paths": {
            "unit": p.unit, "env": p.env, "env_dir": p.env_dir, "current": p.current,
            "backup_dir": p.backup_dir,
        },
        # user roles' files and units ride along in the same facts round trip
        **({"roles": roles_plan.request(t.roles)} if t.roles else {}),
        # and the compile-cache entries a seed would need to know of
        **({"caches": {"root": p.cache, "tmp_root": seed.tmp_root(t)}}
           if t.vars.cache_seed else {}),
    }


def gather(transport: Transport, t: Target) -> HostFacts:
    return parse_facts(t.name, call(transport, t.vars, "facts", agent_request(t), timeout=120))


# Hosts deployed at once by default: threads mostly wait on SSH, and 32 hosts go in one
# wave (bench/fleet); --forks bounds it for a larger fleet or a weak controller.
FORKS = 32


@dataclass(frozen=True)
class Options:
    check: bool = False
    restart: bool = False
    reinstall: bool = False  # build a fresh environment beside the current one
    kill_stale: bool = False  # end processes outside the service that hold GPU memory
    wait: bool = True
    watch: WatchSettings = field(default_factory=WatchSettings)
    state_dir: Path = Path("state")  # traces and the history mirror
    hooks: Hooks | None = None  # drain: controller commands around a restart
    forks: int = FORKS  # hosts worked on at once
    seed: bool = True  # compile caches: seed before a restart, keep after a ready start
    trust: Trust = field(default_factory=Trust)  # who may seed whom (compile caches)
    # the run's view of every watched start (a live table on a terminal); None: plain
    # lines through the deploy's log
    view: Reporter | None = field(default=None, compare=False)


def apply_install(
    transport: Transport, t: Target, plan: Plan, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Build and verify a new environment first (one round trip); only a verified one is
    marked complete and switched to by the rest of the plan. A failure changes nothing
    the service uses: no switch, no restart, the old environment stays current."""
    install = plan.step(ActionKind.INSTALL_ENV)
    if install is None:
        return []
    env_dir = install.payload["env_dir"]
    say(f"installing {t.stack.name} into {env_dir} (minutes)")
    request = {**agent_request(t), "actions": [install.wire()]}
    (res,) = call(transport, t.vars, "apply", request, timeout=3600,
                  on_progress=progress.Told(say))["results"]
    problems = verify_install(t.stack, res, t.rendered.argv)
    if problems:
        if res.get("ok"):  # built but refused: the plan's discard removes it
            discard = plan.step(ActionKind.DISCARD_ENV)
            assert discard is not None, "make_plan lists discard_env after every install_env"
            call(transport, t.vars, "apply", {**agent_request(t), "actions": [
                discard.wire()]}, timeout=600)
        detail = "\n  ".join(problems)
        if res.get("tail"):
            detail += "\n" + res["tail"]
        raise HostError(
            t.name, f"the new environment {env_dir} failed verification; nothing was "
            f"switched or restarted:\n  {detail}",
            fix=(import_remedy(res) or missing_remedy(res, t.stack.name) or (
                f"fix the pins or rules in inventory/stacks/{t.stack.name}.yml"
                if res.get("packages") else "see the install log"))
            + (f" (log: {res['log']} on the host)" if res.get("log") else ""),
        )
    say(f"{env_dir} verified ({res.get('installer')}, {res.get('seconds')} s): pins, rules, "
        f"pip check, import {', '.join(t.stack.verify_imports)}")
    mark = plan.step(ActionKind.MARK_ENV)
    assert mark is not None, "make_plan lists mark_env after every install_env"
    return [{**mark.wire(), "packages": res.get("packages")}]


def missing_remedy(res: dict[str, Any], stack: str) -> str | None:
    """The installer's own word that the index lacks a requirement: name it."""
    missing = [str(m) for m in res.get("missing") or []]
    if not missing:
        return None
    return (f"publish {', '.join(missing)} to the stack's index (index_url / "
            f"extra_index_urls / find_links in inventory/stacks/{stack}.yml), or pin a "
            "version it holds")


def apply_plan(transport: Transport, t: Target, plan: Plan, say: Callable[[str], None],
               done: list[str] | None = None,
               before_stop: Callable[[], None] | None = None,
               store: seed.Store | None = None, seeded: list[str] | None = None,
               tried: list[str] | None = None) -> None:
    """Apply the plan; ``done`` gets the kind of every action the host completed, also
    when a later one fails (a group's rollback asks whether the backup was taken);
    ``tried`` every action the host ran, failed ones too (a failed ``systemctl
    restart`` has stopped the old process first: the host no longer serves it).
    ``before_stop`` (the drain) runs after the install, which may last minutes and fail
    with the old release serving, and right before the round trip that restarts. A
    seed_cache step's blob goes up from ``store`` first; ``seeded`` gets its entries."""
    if not plan.actions:
        return
    seeded = seeded if seeded is not None else []
    first = apply_install(transport, t, plan, say)
    if first and done is not None:  # a verified environment now sits beside the old one
        done.append(ActionKind.INSTALL_ENV)
    skip = {ActionKind.INSTALL_ENV, ActionKind.MARK_ENV}
    sow = plan.step(ActionKind.SEED_CACHE)
    if sow is not None and store is not None:
        try:
            seed.upload(transport, t, store, sow, say)
        except HostError as exc:  # a seed saves minutes; it is never why a deploy fails
            say(f"compile cache: not seeded ({exc}); the start compiles")
            skip.add(ActionKind.SEED_CACHE)
    if before_stop is not None and plan.restarts:
        before_stop()
    request = {**agent_request(t), "actions": first + [
        a.wire() for a in plan.actions if a.kind not in skip and not a.when]}
    reply = call(transport, t.vars, "apply", request, timeout=3600)
    for i, res in enumerate(reply["results"]):
        if tried is not None:
            tried.append(res["kind"])
        if res["ok"] and done is not None:
            done.append(res["kind"])
        if res["kind"] == ActionKind.SEED_CACHE and res["ok"]:
            seeded.extend(str(e) for e in res.get("seeded") or [])
            say(seed.result_line(res))
        if not res["ok"]:
            detail = res.get("error") or "failed"
            before = [r["kind"] for r in reply["results"][:i]]
            detail += f"\n  done before it: {', '.join(before) or 'nothing'}"
            if res.get("tail"):
                detail += "\n" + res["tail"]
            if res.get("permission"):
                raise PermissionDeniedError(t.name, f"{res['kind']}: {detail}",
                                            fix="deploy as root, or set sudo: true")
            raise HostError(t.name, f"{res['kind']} failed: {detail}",
                            fix=f"see {res['log']} on the host" if res.get("log") else None)


def verify_start(transport: Transport, t: Target, opts: Options, log: Log,
                 result: HostResult, *, store: seed.Store | None = None,
                 sown: Action | None = None, seeded: Sequence[str] = ()) -> None:
    """Watch the (re)start with the verify watcher: same budgets, history and trace;
    then the compile cache's stage (keep a ready start's, quarantine a crashed seed)."""
    reporter = opts.view or Reporter(live=False, emit=log)
    outcome = verify_target(t, opts.watch, opts.state_dir, transport=transport,
                            on_poll=reporter.poll, on_note=log,  # a deploy line (above a live view)
                            on_predict=reporter.predicted)
    result.verify = outcome_json(outcome)
    result.verdict = outcome.verdict
    if outcome.error is not None:
        raise VigilError(outcome.error)
    st = outcome.state
    assert st is not None
    result.main_pid = st.main_pid
    if store is not None:
        result.compile_seed = seed.after_start(transport, t, store, outcome, sown,
                                               list(seeded), lambda m: log(t.name, m),
                                               trust=opts.trust)
    if st.verdict != Verdict.READY:
        raise ServeError(t.name, f"verify: {st.verdict} ({st.cause}): {st.proof}",
                         fix=st.remedy or f"see `invoke logs --hosts {t.name}`")
    if outcome.smoke is not None:
        log(t.name, f"serving: {outcome.smoke.tokens} tokens, TTFT "
            f"{outcome.smoke.ttft_s or 0:.2f} s, ready after {outcome.seconds:.0f} s")


def plan_seed_step(t: Target, plan: Plan, store: seed.Store, say: Callable[[str], None],
                   held: Sequence[str], trust: seed.Trust | None = None) -> Plan:
    """The plan with its seed step before the restart, when the store keeps a cache of
    this host's key that the host lacks (``held``: its entries, from the facts) and its
    source may seed this host (``trust``)."""
    m = store.get(seed.key_of(seed.key_fields(t)))
    for warning in store.warnings:
        say(f"compile cache: {warning}")
    if m is not None and m.bad:
        say(f"compile cache of {m.describe()} is quarantined ({m.bad}): not seeded")
    if m is None or m.bad:
        return plan
    refused = (trust or seed.Trust()).refuses(t.name, m)
    if refused is None and t.name in m.refused_by:
        refused = f"{t.name}'s start crashed on it before"
    if refused is not None:
        say(f"compile cache of {m.describe()} not seeded: {refused}")
        return plan
    step = seed.plan_seed(m, held, root=t.rendered.paths.cache,
                          tmp=seed.tmp_root(t), user=t.vars.service_user)
    if step is None:
        return plan
    at = next(i for i, a in enumerate(plan.actions) if a.kind == ActionKind.RESTART)
    return replace(plan, actions=(*plan.actions[:at], step, *plan.actions[at:]))


def deploy_host(t: Target, opts: Options, log: Log) -> HostResult:
    started = time.monotonic()
    result = HostResult(t.name, HostStatus.FAILED)
    done: list[str] = []  # the actions the host completed
    tried: list[str] = []  # and the ones it ran, failed ones too
    drained: list[str] = []  # the drain hook ran and nothing put the host back yet

    def say(message: str) -> None:
        log(t.name, message)

    try:
        with connect(t.name, t.vars) as transport:
            try:
                with host_lock(transport, t.vars, paths_for(t.vars, t.stack).lock, lock_owner(),
                               t.vars.lock_timeout_s, say):
                    facts: HostFacts | None = None
                    if t.takes("service"):
                        facts = gather(transport, t)
                        if t.takes("preflight"):
                            check_host(t.name, t.profile, t.rendered, facts,
                                       kill_stale=opts.kill_stale, stack=t.stack,
                                       policy=GpuPolicy.of(t.vars),
                                       gpus_needed=t.gpus_needed)
                        stale = (tuple(s.pid for s in stale_gpu_processes(facts))
                                 if opts.kill_stale else ())
                        plan = make_plan(t.name, t.stack, t.rendered, facts,
                                         force_restart=opts.restart, reinstall=opts.reinstall,
                                         kill_pids=stale, host=t.vars)
                        role_facts = facts.roles
                    else:  # a host that takes only user roles
                        plan = Plan(t.name, (), False)
                        role_facts = (call(transport, t.vars, "role_facts",
                                           roles_plan.request(t.roles)) if t.roles else None)
                    if t.roles:
                        extra = roles_plan.plan_roles(
                            t.roles, roles_plan.parse_role_facts(role_facts))
                        plan = replace(plan, actions=roles_plan.with_role_backup(
                            plan.actions, extra, t.roles,
                            release_exists=facts is not None and facts.release_exists))
                    store = seed.store_for(t, opts.state_dir) if (
                        opts.seed and t.vars.cache_seed and t.takes("service")) else None
                    if store is not None and plan.restarts:
                        assert facts is not None  # gathered for the service role
                        plan = plan_seed_step(t, plan, store, say, facts.caches or (),
                                              opts.trust)
                    result.actions = plan.describe() if plan.actions else []
                    for line in plan.describe():
                        say(("would " if opts.check and plan.actions else "") + line)
                    if opts.check:
                        for action in plan.actions:
                            if action.diff:
                                log.block(action.diff)
                        result.status = HostStatus.CHANGED if plan.changes else HostStatus.OK
                        result.main_pid = facts.service.main_pid or None if facts else None
                        return result
                    hooks = opts.hooks if plan.restarts else None

                    def drain() -> None:
                        assert hooks is not None
                        if hooks.before_stop:  # without one nothing was taken out of a pool
                            drained.append(t.name)
                        hooks.run("before_stop", t, say)

                    seeded: list[str] = []
                    apply_plan(transport, t, plan, say, done,
                               before_stop=drain if hooks is not None else None,
                               store=store, seeded=seeded, tried=tried)
                    # what was done: a step whose condition never came is left out
                    result.actions = [a.describe() for a in plan.actions if not a.when]
                    result.restarted = plan.restarts
                    need_wait = facts is not None and t.takes("verify") and (
                        plan.restarts or facts.health_status != 200)
                    if opts.wait and need_wait:
                        say("verifying the start: phases, evidence, a real completion")
                        verify_start(transport, t, opts, log, result, store=store,
                                     sown=plan.step(ActionKind.SEED_CACHE) if seeded else None,
                                     seeded=seeded)
                        if hooks is not None:
                            hooks.run("after_ready", t, say)
                            drained.clear()
                    elif facts is not None:
                        result.main_pid = facts.service.main_pid or None
                    result.status = HostStatus.CHANGED if plan.changes else HostStatus.OK
            finally:
                result.round_trips = transport.round_trips
    except Exception as exc:  # a bug must fail this host, not vanish with its thread
        err = exc if isinstance(exc, VigilError) else InternalError.of(t.name, exc)
        result.error = str(err)
        result.exit_code = int(err.exit_code)
        say(f"{failed_word(int(err.exit_code))}: {err}")
        if drained and opts.hooks is not None:
            result.error += undrain(t, opts.hooks, restarted=ActionKind.RESTART in tried,
                                    say=say)
    finally:
        result.replaced = ActionKind.BACKUP in done
        result.applied = list(done)
        result.seconds = round(time.monotonic() - started, 2)
    return result


def undrain(t: Target, hooks: Hooks, *, restarted: bool, say: Callable[[str], None]) -> str:
    """After a failure past the drain: put the host back while its old release still
    serves (the restart never ran); else say loudly that it is left drained. The text is
    added to the host's error."""
    if restarted or not hooks.after_ready:
        left = (f"\n  {t.name} is LEFT DRAINED: --before-stop ran and "
                + ("the service was restarted into the failure" if restarted
                   else "no --after-ready is given to put it back"))
        say(left.strip())
        return left + ("; put it back in the pool once it serves (a rollback with "
                       "--after-ready does)")
    try:
        hooks.run("after_ready", t, say)
    except HostError as exc:
        why = exc.message.removeprefix(f"{t.name}: ")
        say(f"{t.name} is LEFT DRAINED: putting it back failed: {why}")
        return f"\n  {t.name} is LEFT DRAINED: putting it back failed: {why}"
    say("undrained: the old release was never stopped and still serves")
    return "\n  undrained: the old release was never stopped and still serves"
