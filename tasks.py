"""vigil's front door: Invoke tasks. Thin on purpose: parse flags, call vigil, print.

Config layers (Invoke): defaults < invoke.yaml < ~/.invoke.yaml < INVOKE_VIGIL_* env
< flags. Exit codes are documented in README.md and vigil/exitcodes.py.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

import lab.tasks
import vigil.tasks.runtime
from vigil.deploy import apply as deploy_mod
from vigil.desired import targets as targets_mod
from vigil.desired.config import HostVars
from vigil.desired.render import service_paths
from vigil.errors import VigilError
from vigil.exitcodes import ExitCode
from vigil.report import Log, results_json, summary_table, write_json
from vigil.tasks.common import HOSTS_HELP, load_inventory, parallel, setting, user_errors
from vigil.transport.remote import call
from vigil.transport.ssh import Transport, connect, privileged


@task(
    help={
        "model": "model profile (inventory/models/NAME.yml); default: the host's `model`",
        "hosts": HOSTS_HELP,
        "check": "show the plan and diffs, change nothing",
        "restart": "restart even when nothing changed",
        "stack": "runtime stack (inventory/stacks/NAME.yml); default: the host's `stack`",
        "set": "KEY=VALUE override of a host variable or profile field (repeatable)",
        "json": "write the per-host summary as JSON to this file",
        "no_wait": "do not wait until the service serves",
        "reinstall": "build a fresh environment beside the current one; switch only if it "
        "passes verification",
        "kill_stale": "end processes outside the service that hold GPU memory",
        "serial": "roll in batches: a count, a percentage or a list (1,25%,100%); each "
        "batch starts once every host of the one before is ready or failed",
        "max_fail": "failed hosts a batch may have (count or %, default 0) before the "
        "rollout stops; later hosts stay untouched",
        "rollback_failed": "when the rollout stops, put its failed hosts back on their "
        "previous release and verify them",
        "junit": "write a JUnit XML report (one test case per host) to this file",
        "before_stop": "command run on this machine before a host's service restarts "
        "(VIGIL_HOST, VIGIL_ADDRESS, VIGIL_PORT in its environment)",
        "after_ready": "command run on this machine once a restarted host is proven ready",
    },
    iterable=["set_"],
)
def deploy(
    c: Context,
    model: str | None = None,
    hosts: str = "all",
    check: bool = False,
    restart: bool = False,
    stack: str | None = None,
    set_: list[str] | None = None,
    json: str | None = None,
    no_wait: bool = False,
    reinstall: bool = False,
    kill_stale: bool = False,
    serial: str | None = None,
    max_fail: str | None = None,
    rollback_failed: bool = False,
    junit: str | None = None,
    before_stop: str | None = None,
    after_ready: str | None = None,
) -> None:
    """Plan, apply, restart only what changed, and wait until the service serves."""
    from vigil.deploy import rollout
    from vigil.deploy.hooks import Hooks

    with user_errors():
        inv = load_inventory(c)
        targets = targets_mod.resolve(
            inv, hosts, model=model, stack=stack, sets=set_ or [],
            template_dir=setting(c, "templates"),
        )
        log = Log(width=max(len(t.name) for t in targets))
        opts = deploy_mod.Options(check=check, restart=restart, wait=not no_wait,
                                  reinstall=reinstall, kill_stale=kill_stale,
                                  state_dir=setting(c, "state_dir"),
                                  hooks=Hooks.parse(before_stop, after_ready))
        if serial or max_fail or rollback_failed or junit:
            ro = rollout.run(targets, opts, log, serial=serial, max_fail=max_fail,
                             rollback_failed=rollback_failed)
            print(rollout.summary(ro))
            if json:
                write_json(json, rollout.rollout_json(ro))
            if junit:
                rollout.write_junit(junit, ro)
            if ro.exit_code:
                raise Exit(code=ro.exit_code)
            return
        results = deploy_mod.deploy(targets, opts, log)
        print(summary_table(results))
        if json:
            write_json(json, results_json(results))
        if any(r.status == "failed" for r in results):
            raise Exit(code=int(ExitCode.FAILED))


@task(
    help={
        "model": "model profile; default: the host's `model`",
        "host": "one host whose variables to use",
        "out": "directory to write the unit and env file into",
        "stack": "runtime stack; default: the host's `stack`",
        "set": "KEY=VALUE override (repeatable)",
    },
    iterable=["set_"],
)
def render(
    c: Context,
    host: str,
    model: str | None = None,
    out: str = "rendered",
    stack: str | None = None,
    set_: list[str] | None = None,
) -> None:
    """Write the rendered unit and env file (secrets masked) to a directory."""
    with user_errors():
        targets = targets_mod.resolve(
            load_inventory(c), host, model=model, stack=stack, sets=set_ or [],
            template_dir=setting(c, "templates"), require_secrets=False,
        )
        if len(targets) != 1:
            raise VigilError(f"--host {host!r} names {len(targets)} hosts; name one")
        t = targets[0]
        target = Path(out)
        target.mkdir(parents=True, exist_ok=True)
        unit = target / Path(t.rendered.paths.unit).name
        env = target / Path(t.rendered.paths.env).name
        unit.write_text(t.rendered.unit_text)
        env.write_text(t.rendered.env_masked)
        env.chmod(0o600)
        print(f"{unit}\n{env}  (secrets masked)")


def _each_host(
    c: Context,
    hosts: str,
    work: Callable[[str, HostVars, Transport], None],
    on_error: Callable[[str, VigilError], None],
) -> None:
    """Run `work` on every selected host in parallel, each over its own connection."""
    inv = load_inventory(c)
    chosen = [(name, inv.host_vars(name)) for name in inv.select(hosts)]

    def run(name: str, hv: HostVars) -> None:
        try:
            transport = connect(name, hv)
            try:
                work(name, hv, transport)
            finally:
                transport.close()
        except VigilError as exc:
            on_error(name, exc)

    parallel(chosen, lambda item: run(*item))


def _flag(exec_start: str, *names: str) -> str | None:
    """The value of the first `--name=value` word of an ExecStart line."""
    words = shlex.split(exec_start) if exec_start else []
    for name in names:
        value = next((w.split("=", 1)[1] for w in words if w.startswith(f"--{name}=")), None)
        if value:
            return value
    return None


@task(help={"hosts": HOSTS_HELP})
def status(c: Context, hosts: str = "all") -> None:
    """Unit state, main PID, uptime, model, port and /health of each host."""
    rows: dict[str, str] = {}
    failed: list[str] = []

    def work(name: str, hv: HostVars, transport: Transport) -> None:
        reply = call(transport, hv, "status", {
            "unit": hv.service, "port": hv.port, "unit_path": service_paths(hv)["unit"]})
        svc = reply["service"]
        up = reply.get("uptime_s")
        uptime = f"{int(up // 3600)}h{int(up % 3600 // 60):02d}m{int(up % 60):02d}s" if up else "-"
        rows[name] = (
            f"{svc.get('ActiveState', '?')}/{svc.get('SubState', '?'):<9} "
            f"pid {svc.get('MainPID', '-'):<7} up {uptime:<10} "
            f"port {_flag(reply['exec_start'], 'port') or '-':<5} "
            f"health {reply.get('health') or '-':<4} "
            f"model {_flag(reply['exec_start'], 'model') or '-'}"
        )

    def unreachable(name: str, exc: VigilError) -> None:
        rows[name] = f"unreachable  {str(exc).splitlines()[0]}"
        failed.append(name)

    with user_errors():
        _each_host(c, hosts, work, unreachable)
    width = max(len(n) for n in rows)
    for name in sorted(rows):
        print(f"{name:<{width}}  {rows[name]}")
    if failed:
        raise Exit(code=int(ExitCode.FAILED))


@task(help={"hosts": HOSTS_HELP, "follow": "keep printing new lines", "lines": "how many"})
def logs(c: Context, hosts: str = "all", follow: bool = False, lines: int = 100) -> None:
    """The service's journal on each host."""
    log = Log()

    def work(name: str, hv: HostVars, transport: Transport) -> None:
        command = privileged(
            f"journalctl -u {shlex.quote(hv.service)} -n {int(lines)} --no-pager -o short-iso"
            + (" -f" if follow else ""), hv,
        )
        if not follow:
            log(name, transport.run(command, timeout=60).stdout.rstrip("\n"))
            return
        held = transport.hold(command)
        while (line := held.readline(timeout=3600)) != "":
            if line:
                log(name, line.rstrip("\n"))

    with user_errors():
        _each_host(c, hosts, work, lambda name, exc: log(name, f"error: {exc}"))


def _watch_rollback(c: Context, name: str, hv: HostVars, transport: Transport, served: str,
                    log: Log) -> int | None:
    """Watch the restored release start with the verify watcher; its main PID."""
    from vigil.desired.render import CACHE_ROOT
    from vigil.verify import report as verify_report
    from vigil.verify import watch

    settings = _watch_settings(c, None, None)
    assert isinstance(settings, watch.Settings)
    target = watch.ProbeTarget(
        unit=hv.service, port=hv.port, user=hv.service_user,
        cache_dir=f"{CACHE_ROOT}/{hv.service}", python=f"{hv.env_root}/current/bin/python",
        model=served, api_key=dict(hv.env).get("VLLM_API_KEY"))
    reporter = verify_report.Reporter(live=False, emit=log)
    out = watch.watch_service(name, transport, target, settings, setting(c, "state_dir"),
                              privileged_fn=lambda cmd: privileged(cmd, hv),
                              on_poll=reporter.poll)
    if out.error is not None:
        raise VigilError(out.error)
    st = out.state
    assert st is not None
    if st.verdict != "ready":
        raise VigilError(f"{name}: after rollback: {st.verdict} ({st.cause}): {st.proof}"
                         + (f"\n  fix: {st.remedy}" if st.remedy else ""))
    return st.main_pid


@task(help={"hosts": HOSTS_HELP, "no_wait": "do not wait until the service serves"})
def rollback(c: Context, hosts: str = "all", no_wait: bool = False) -> None:
    """Put the previous unit, env file and environment back, restart, wait until serving."""
    log = Log()
    failed: list[str] = []

    def work(name: str, hv: HostVars, transport: Transport) -> None:
        paths = service_paths(hv)
        reply = call(transport, hv, "rollback", {"unit": hv.service, "paths": paths},
                     timeout=600)
        if not reply["ok"]:
            raise VigilError(f"{name}: rollback failed: {reply['error']}")
        log(name, f"restored {', '.join(reply['restored'])}; restarted")
        if not no_wait:
            st = call(transport, hv, "status", {
                "unit": hv.service, "port": hv.port, "unit_path": paths["unit"]})
            served = _flag(st["exec_start"], "served-model-name", "model") or ""
            res = _watch_rollback(c, name, hv, transport, served, log)
            log(name, f"serving again, pid {res}")

    def fail(name: str, exc: VigilError) -> None:
        log(name, f"FAILED: {exc}")
        failed.append(name)

    with user_errors():
        _each_host(c, hosts, work, fail)
    if failed:
        raise Exit(code=int(ExitCode.FAILED))


def _watch_settings(c: Context, poll: float | None, stall: float | None) -> object:
    from vigil.verify.watch import Settings

    cfg = c.config.vigil
    poll_s = float(poll if poll is not None else cfg.get("poll_s", 5.0))
    if poll_s <= 0 or (stall is not None and stall <= 0):
        from vigil.errors import ConfigError

        raise ConfigError("--poll and --stall must be positive seconds", key="--poll/--stall",
                          fix="e.g. --poll 5 --stall 60")
    return Settings(poll_s=poll_s, stall_s=stall,
                    min_samples=int(cfg.get("history_min_samples", 3)))


@task(
    help={
        "hosts": HOSTS_HELP,
        "model": "model profile; default: the host's `model`",
        "json": "write verdicts, phases, budgets, evidence and smoke as JSON to this file",
        "junit": "write a JUnit XML report (one test case per host) to this file",
        "poll": "seconds between polls (default vigil.poll_s, 5)",
        "stall": "override every phase's stall window, in seconds",
    },
)
def verify(
    c: Context,
    hosts: str = "all",
    model: str | None = None,
    json: str | None = None,
    junit: str | None = None,
    poll: float | None = None,
    stall: float | None = None,
) -> None:
    """Watch each host's vLLM start phase by phase: ready, stalled, crashed or timed out."""
    from concurrent.futures import ThreadPoolExecutor

    from vigil.verify import report as verify_report
    from vigil.verify import watch

    with user_errors():
        settings = _watch_settings(c, poll, stall)
        assert isinstance(settings, watch.Settings)
        targets = targets_mod.resolve(load_inventory(c), hosts, model=model,
                                     template_dir=setting(c, "templates"))
        state_dir = setting(c, "state_dir")
        with verify_report.Reporter() as rep, ThreadPoolExecutor(
                max_workers=min(16, len(targets))) as pool:
            outcomes = list(pool.map(lambda t: watch.verify_target(
                t, settings, state_dir, on_poll=rep.poll, on_note=rep.note), targets))
        code = watch.worst_exit(outcomes)
        print(verify_report.summary(outcomes))
        if json:
            write_json(json, verify_report.run_json(outcomes, code))
        if junit:
            verify_report.write_junit(junit, outcomes)
    if code:
        raise Exit(code=code)


@task(help={"model": "only this model profile", "hosts": HOSTS_HELP + " (default: every host)"})
def history(c: Context, model: str | None = None, hosts: str | None = None) -> None:
    """Past starts from the local mirror: phase durations, verdicts, cold/warm."""
    from vigil.verify import history as history_mod
    from vigil.verify import report as verify_report

    with user_errors():
        names = load_inventory(c).select(hosts) if hosts else None
        mirror = history_mod.Mirror(setting(c, "state_dir") / "history.sqlite")
        print(verify_report.history_table(mirror.records(model=model, hosts=names)))


@task(help={"json": "print the result as JSON"}, positional=["file"])
def replay(c: Context, file: str, json: bool = False) -> None:
    """Re-run the watcher on a recorded trace or a vLLM log: phases and verdict."""
    import json as json_mod

    from vigil.verify import replay as replay_mod

    with user_errors():
        out = replay_mod.replay_file(file)
    if json:
        print(json_mod.dumps(out, indent=2))
        return
    for ph in out["phases"]:
        print(f"{ph['name']:<18} {ph['duration_s']:>9.1f} s")
    line = f"verdict: {out['verdict'] or 'none'}"
    if out.get("cause"):
        line += f" ({out['cause']})"
    print(line)
    for key in ("proof", "remedy", "evidence", "note"):
        if out.get(key):
            print(f"{key}: {out[key]}")


ns = Collection(deploy, render, status, logs, rollback, verify, history, replay)
ns.add_collection(lab.tasks.ns)
ns.add_task(vigil.tasks.runtime.preflight)
ns.add_collection(vigil.tasks.runtime.stack)
ns.configure({"vigil": {"inventory": "inventory", "roles": "roles",
                        "templates": "roles/service/templates", "state_dir": "state",
                        "poll_s": 5.0, "history_min_samples": 3}})
