"""Invoke tasks of the service on its hosts: ``deploy``, ``render``, ``status``, ``logs``,
``rollback``. Each parses its flags, makes one library call and reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from invoke.context import Context

from vigil.errors import ConfigError
from vigil.report import HostResult, Log, echo, failed_word
from vigil.tasks import pipeline
from vigil.tasks.common import (
    CHANGING_HOSTS_HELP,
    HOSTS_HELP,
    SET_HELP,
    JsonFlag,
    checked_inventory,
    emit_json,
    exit_with,
    hosts_given,
    json_help,
    load_inventory,
    out_path,
    setting,
    template_dirs,
    text_stream,
    user_errors,
    vigil_task,
    watch_settings,
    worst_code,
)

if TYPE_CHECKING:  # a task's libraries load when it runs, not at `vigil --help`
    pass

# deploy.apply.FORKS, here so that --help does not load the deploy library (a test holds
# them equal)
FORKS = 32


if TYPE_CHECKING:  # a task's libraries load when it runs, not at `vigil --help`
    from vigil.deploy import seed as seed_mod
    from vigil.deploy import service
    from vigil.desired.config import HostVars
    from vigil.desired.targets import Target
    from vigil.transport.base import Transport
    from vigil.verify import predict

# deploy.apply.FORKS, here so that --help does not load the deploy library (a test holds
# them equal)
FORKS = 32


@vigil_task(
    help={
        "model": "model profile (inventory/models/NAME.yml); default: the host's `model`",
        "hosts": CHANGING_HOSTS_HELP,
        "check": "show the plan and diffs, change nothing",
        "restart": "restart even when nothing changed",
        "stack": "runtime stack (inventory/stacks/NAME.yml); default: the host's `stack`",
        "set": SET_HELP,
        "json": json_help("the per-host summary"),
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
        "html": "write the rollout's picture (hosts x time, batches, verdicts) to this file",
        "forks": "hosts worked on at once (default 32; a batch of --serial too)",
        "seed": "seed compile caches from a ready start of the same key and keep this "
        "run's (--no-seed: neither; inventory: cache_seed: false)",
    },
    iterable=["set_"],
)
def deploy(
    c: Context,
    model: str | None = None,
    hosts: str | None = None,
    check: bool = False,
    restart: bool = False,
    stack: str | None = None,
    set_: list[str] | None = None,
    json: JsonFlag = None,
    no_wait: bool = False,
    reinstall: bool = False,
    kill_stale: bool = False,
    serial: str | None = None,
    max_fail: str | None = None,
    rollback_failed: bool = False,
    junit: str | None = None,
    before_stop: str | None = None,
    after_ready: str | None = None,
    html: str | None = None,
    forks: int = FORKS,
    seed: bool = True,
) -> None:
    """Plan, apply, restart only what changed, and wait until the service serves."""
    from vigil.deploy import apply as deploy_mod
    from vigil.deploy import rollout
    from vigil.deploy import seed as seed_mod
    from vigil.deploy.hooks import Hooks
    from vigil.desired import targets as targets_mod
    from vigil.verify import predict
    from vigil.verify.report import Reporter

    with user_errors():
        if forks < 1:
            raise ConfigError(f"{forks} hosts at once: at least 1", key="--forks",
                              fix=f"e.g. --forks {FORKS}")
        rollout.parse_serial(serial)  # a bad or empty --serial before anything is read
        inv, pattern = load_inventory(c), hosts_given(hosts, "deploy")
        inv.refuse_controller(pattern, "deploy")
        targets = targets_mod.resolve(
            inv, pattern, model=model, stack=stack, sets=set_ or [],
            template_dir=template_dirs(c),
        )
        trust = seed_mod.trust_of(targets, inv.select)
        out = text_stream(json)
        settings, hooks = watch_settings(c), Hooks.parse(before_stop, after_ready)
        # a terminal gets verify's live table of the starts, the log's lines above it;
        # elsewhere (CI, a pipe) plain timestamped lines
        with Reporter(out) as view:
            log = view.log(width=max(len(t.name) for t in targets))
            opts = deploy_mod.Options(check=check, restart=restart, wait=not no_wait,
                                      reinstall=reinstall, kill_stale=kill_stale,
                                      watch=settings, state_dir=setting(c, "state_dir"),
                                      forks=forks, hooks=hooks, seed=seed, trust=trust,
                                      view=view if view.live else None)
            # one path whatever report flags are given: a plain deploy is a rollout of
            # one batch, with the same log, summary and exit code
            ro = rollout.run(targets, opts, log, serial=serial, max_fail=max_fail,
                             rollback_failed=rollback_failed)
        extra: dict[str, Any] = {}
        if check:
            later = seeded_later(targets, [b.hosts for b in ro.batches], ro.results,
                                 log, trust) if seed else {}
            ahead = predict_restarts(targets, ro.results, setting(c, "state_dir"), log,
                                     seeded=later)
            if ro.batched:
                whole = predict.rollout([b.hosts for b in ro.batches], ahead)
                log("rollout", whole.line())
                extra["prediction"] = whole.to_json()
        view.show(rollout.summary(ro))
        pipeline.report("deploy", pipeline.deploy_rows([*ro.results, *ro.rolled_back]),
                        stream=out)
        emit_json(c, json, {**rollout.rollout_json(ro), **extra})
        if junit:
            rollout.write_junit(str(out_path(c, junit)), ro)
        if html:
            from vigil.deploy.rollout_html import write_html

            write_html(str(out_path(c, html)), ro)
    exit_with([ro.exit_code])


def _restarts(r: HostResult) -> bool:
    return not r.error and any(a.startswith("restart:") for a in r.actions)


def seeded_later(targets: Sequence[Target], batches: Sequence[Sequence[str]],
                 results: Sequence[HostResult], log: Log,
                 trust: seed_mod.Trust | None = None) -> dict[str, str]:
    """deploy --check of a rollout: the restarting hosts of later batches that the first
    ready start of their key in an earlier batch will seed (nothing is kept for the key
    yet, so their plans cannot show it), when that host is a seed source they trust:
    host → that earlier host, each said with whose code it will run."""
    from vigil.deploy import seed as seed_mod

    canary = batches[0][0] if batches and batches[0] else None
    trust = replace(trust or seed_mod.Trust(), canary=canary)
    by_target = {t.name: t for t in targets}
    by_result = {r.host: r for r in results}
    first: dict[str, str] = {}  # key → the first restarting host of it, batches before
    out: dict[str, str] = {}
    for names in batches:
        keys: dict[str, str] = {}
        for name in names:
            t, r = by_target.get(name), by_result.get(name)
            if t is None or r is None or not _restarts(r) or not t.vars.cache_seed:
                continue
            keys[name] = key = seed_mod.key_of(seed_mod.key_fields(t))
            src = first.get(key)
            if src is None or any(a.startswith("seed_cache:") for a in r.actions):
                continue
            refused = trust.refuses(name, seed_mod.Manifest(
                key, {}, src, 0.0, (), trust=trust.keeps(src) or ""))
            if refused is None:
                out[name] = src
                log(name, f"would seed_cache: from {src}'s start (an earlier batch, the same "
                    f"key) once it is ready: runs code compiled on {src}")
        for name, key in keys.items():
            if trust.keeps(name) is not None:  # only a seed source's start is kept
                first.setdefault(key, name)
    return out


def predict_restarts(targets: Sequence[Target], results: Sequence[HostResult],
                     state_dir: Path, log: Log,
                     seeded: Mapping[str, str] | None = None) -> dict[str, predict.Prediction]:
    """deploy --check: each planned restart's start predicted from the local history
    mirror (not created by a check that finds none), said and kept on its result; a host
    a seed will warm (planned, or from an earlier batch: ``seeded``) predicted warm."""
    from vigil.verify import history as history_mod
    from vigil.verify import predict

    path = state_dir / "history.sqlite"
    records = history_mod.Mirror(path).records() if path.exists() else []
    by_name = {t.name: t for t in targets}
    out: dict[str, predict.Prediction] = {}
    for r in results:
        t = by_name.get(r.host)
        if t is None or not _restarts(r):
            continue
        warm = r.host in (seeded or {}) or any(a.startswith("seed_cache:") for a in r.actions)
        out[r.host] = p = predict.before_restart(records, t, seeded=warm)
        r.prediction = p.to_json()
        log(r.host, f"the restart: {p.line()}: {p.cache_why}")
    return out


@vigil_task(
    help={
        "model": "model profile; default: the host's `model`",
        "hosts": HOSTS_HELP,
        "out": "directory to write each host's files into (OUT/HOST/)",
        "stack": "runtime stack; default: the host's `stack`",
        "set": SET_HELP,
    },
    iterable=["set_"],
)
def render(
    c: Context,
    hosts: str = "all",
    model: str | None = None,
    out: str = "rendered",
    stack: str | None = None,
    set_: list[str] | None = None,
) -> None:
    """Write each host's files (secrets masked) to OUT/HOST/; where each variable is set."""
    from vigil.desired import review
    from vigil.desired import targets as targets_mod

    with user_errors():
        targets = targets_mod.resolve(
            load_inventory(c), hosts, model=model, stack=stack, sets=set_ or [],
            template_dir=template_dirs(c), require_secrets=False, local_files=False,
        )
        for t in targets:
            echo("\n".join(review.write_files(t, out_path(c, out) / t.name)))
            echo(f"\nvariables of {t.name} ({review.PRECEDENCE}):")
            echo("\n".join(review.variables(t)) + "\n")


def _report(runs: list[service.HostRun[str]], width: int | None = None,
            stream: TextIO | None = None) -> None:
    width = width or max(len(r.host) for r in runs)
    for r in runs:
        text = r.value if r.error is None else \
            f"{failed_word(r.error.exit_code)}  {str(r.error).splitlines()[0]}"
        echo(f"{r.host:<{width}}  {text}", file=stream)


@vigil_task(help={"hosts": HOSTS_HELP,
                  "json": json_help("each host's unit state, PID, uptime, port, model and "
                                    "/health")})
def status(c: Context, hosts: str = "all", json: JsonFlag = None) -> None:
    """Unit state, main PID, uptime, model, port and /health of each host."""
    from vigil.deploy import service

    with user_errors():
        runs = service.on_hosts(checked_inventory(c, hosts), hosts,
                                lambda name, hv, t: service.status(t, hv))
    codes = [int(r.error.exit_code) for r in runs if r.error is not None]
    _report([service.HostRun(r.host, r.value.line() if r.value is not None else None,
                             r.error) for r in runs], stream=text_stream(json))
    code = worst_code(codes)
    emit_json(c, json, {"ok": code == 0, "exit_code": code, "hosts": {
        r.host: {"result": "ok" if r.error is None else failed_word(r.error.exit_code),
                 **(asdict(r.value) if r.value is not None else {}),
                 "error": None if r.error is None else str(r.error)} for r in runs}})
    exit_with(codes)


@vigil_task(help={"hosts": HOSTS_HELP, "follow": "keep printing new lines",
                  "lines": "how many of the last lines (0 with --follow: only new ones)"})
def logs(c: Context, hosts: str = "all", follow: bool = False, lines: int = 100) -> None:
    """The service's journal on each host."""
    from vigil.deploy import service

    log = Log()
    with user_errors():
        if lines < 0:  # 0 is journalctl's own: none of the old lines (--follow: new ones)
            raise ConfigError(f"--lines {lines}: at least 0", key="--lines",
                              fix="e.g. --lines 100 (the last 100 lines), or --follow "
                              "--lines 0 (only new ones)")
        inv = checked_inventory(c, hosts)
        if follow:
            runs = service.on_hosts(inv, hosts, lambda name, hv, t: service.follow(
                t, hv, lines, lambda line: log(name, line)))
        else:
            runs = service.on_hosts(inv, hosts, lambda name, hv, t: log(
                name, service.journal(t, hv, lines).rstrip("\n")))
    for r in runs:
        if r.error is not None:
            log(r.host, f"{failed_word(r.error.exit_code, 'error')}: {r.error}")
    exit_with([int(r.error.exit_code) for r in runs if r.error is not None])


@vigil_task(help={"hosts": CHANGING_HOSTS_HELP,
                  "no_wait": "do not wait until the service serves"})
def rollback(c: Context, hosts: str | None = None, no_wait: bool = False) -> None:
    """Put the previous unit, env file and environment back, restart, wait until serving."""
    from vigil.deploy import service

    log = Log()
    with user_errors():
        settings, state_dir = watch_settings(c), setting(c, "state_dir")

        def one(name: str, hv: HostVars, t: Transport) -> int | None:
            out = service.rollback(t, hv, wait=not no_wait, settings=settings,
                                   state_dir=state_dir, log=log)
            return None if out is None else service.ready_pid(name, out)

        inv, pattern = load_inventory(c), hosts_given(hosts, "rollback")
        inv.refuse_controller(pattern, "rollback")
        inv.check_inputs(pattern)
        runs = service.on_hosts(inv, pattern, one)
    for r in runs:
        if r.error is not None:
            log(r.host, f"{failed_word(r.error.exit_code)}: {r.error}")
        elif not no_wait:
            log(r.host, f"serving again, pid {r.value}")
    exit_with([int(r.error.exit_code) for r in runs if r.error is not None])
