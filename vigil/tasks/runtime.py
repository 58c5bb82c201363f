"""Invoke tasks of the runtime: ``preflight`` (facts and go/no-go) and ``stack.check``
(drift report). Both read and change nothing; thin shells over facts, preflight and the
stack rule engine. Registered in tasks.py."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit

from vigil.errors import ConfigError, VigilError
from vigil.exitcodes import ExitCode
from vigil.report import echo, failed_word
from vigil.tasks.common import (
    HOSTS_HELP,
    JsonFlag,
    emit_json,
    json_help,
    load_inventory,
    parallel,
    template_dirs,
    text_stream,
    user_errors,
    vigil_task,
    worst_code,
)

if TYPE_CHECKING:  # a task's libraries load when it runs, not at `vigil --help`
    from vigil.desired import inventory as inventory_mod
    from vigil.desired import targets as targets_mod
    from vigil.desired.config import HostVars


# -- stack.check ----------------------------------------------------------------------


@dataclass
class Drift:
    host: str
    stack: str
    current: str | None = None
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    exit_code: int = 0  # the error's (UNREACHABLE for a host never reached)
    seconds: float = 0.0
    round_trips: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and self.error is None


def stack_of(inv: inventory_mod.Inventory, name: str, hv: HostVars, stack: str | None) -> str:
    chosen = stack or hv.stack or (inv.profile(hv.model).stack if hv.model else None)
    if not chosen:
        raise ConfigError(f"no stack for host {name}",
                          fix=f"pass --stack (one of: {', '.join(inv.names('stacks'))})")
    return chosen


def drift(inv: inventory_mod.Inventory, name: str, stack: str | None,
          pip_check: bool = True) -> Drift:
    """One host's drift: one round trip (the agent's ``packages`` verb)."""
    from vigil.deploy.runtime import pip_for
    from vigil.desired.stacks import check as check_stack
    from vigil.desired.stacks import pip_check_problems
    from vigil.transport.remote import call
    from vigil.transport.ssh import connect

    hv = inv.host_vars(name)
    st = inv.stack(stack_of(inv, name, hv, stack))
    out = Drift(name, st.name)
    started = time.monotonic()
    try:
        with connect(name, hv) as transport:
            try:
                reply = call(transport, hv, "packages",
                             {"current": f"{hv.env_root}/current", "pip_check": pip_check})
            finally:
                out.round_trips = transport.round_trips
    except VigilError as exc:
        out.error, out.exit_code = str(exc), int(exc.exit_code)
        return out
    finally:
        out.seconds = round(time.monotonic() - started, 3)
    out.current = reply.get("current")
    if reply.get("packages") is None:
        out.problems.append(f"no environment to check: {reply.get('env_error')}")
        return out
    pip = pip_for(out.current or f"{hv.env_root}/current", reply["packages"], reply.get("uv"))
    out.problems = [f.describe() for f in check_stack(st, reply["packages"], pip)]
    out.problems += [f"pip check: {line}" for line in
                     pip_check_problems(str(reply.get("pip_check") or ""), st)]
    if not reply.get("complete"):
        out.problems.append(f"{out.current} has no .vigil-complete marker (unfinished build)")
    return out


@vigil_task(help={
    "hosts": HOSTS_HELP,
    "stack": "compare with this stack (inventory/stacks/NAME.yml); default: the host's",
    "no_pip_check": "skip `pip check` in the environment",
    "json": json_help("each host's environment and its differences from the stack"),
})
def check(c: Context, hosts: str = "all", stack: str | None = None,
          no_pip_check: bool = False, json: JsonFlag = None) -> None:
    """Drift report: the running environment against its stack's pins and rules."""
    with user_errors():
        inv = load_inventory(c)
        names = inv.check_inputs(hosts)
        for n in names:  # bad input fails before any connection
            inv.stack(stack_of(inv, n, inv.host_vars(n), stack))
    results: dict[str, Drift] = {}

    def work(n: str) -> None:
        results[n] = drift(inv, n, stack, pip_check=not no_pip_check)

    parallel(names, work)
    out = text_stream(json)
    width = max(len(n) for n in names)
    for n in names:
        d = results[n]
        head = f"{n:<{width}}  {d.stack:<24} {d.seconds:6.2f} s  "
        if d.error:
            echo(head + f"{_drift_word(d)}  {d.error.splitlines()[0]}", file=out)
        elif d.ok:
            echo(head + f"ok  {d.current}", file=out)
        else:
            echo(head + f"DRIFT  {d.current}", file=out)
            for p in d.problems:
                echo(f"{'':<{width}}    {p}", file=out)
    code = worst_code([d.exit_code or (0 if d.ok else ExitCode.FAILED)
                       for d in results.values()])
    emit_json(c, json, {"ok": code == 0, "exit_code": code, "hosts": {
        n: {"result": _drift_word(results[n]), **asdict(results[n])} for n in names}})
    if code:
        raise Exit(code=code)


def _drift_word(d: Drift) -> str:
    return failed_word(d.exit_code or ExitCode.FAILED) if d.error else "ok" if d.ok \
        else "DRIFT"


# -- preflight ------------------------------------------------------------------------


def _facts_lines(t: targets_mod.Target, facts: Any) -> list[str]:
    from vigil.deploy.gpucheck import GpuPolicy, health_lines, newest_cuda
    from vigil.deploy.gpus import GIB
    from vigil.deploy.preflight import stale_gpu_processes
    from vigil.deploy.runtime import findings
    from vigil.deploy.weights import summary as weights_summary

    g = facts.gpus
    lines = [f"GPUs: {g.count} via {g.source}" + (f" (NVML: {g.error})" if g.error else "")]
    for gpu in g.gpus:
        lines.append(f"  GPU {gpu.index} {gpu.name}: {gpu.memory_used_bytes / GIB:.1f} of "
                     f"{gpu.memory_total_bytes / GIB:.1f} GiB used, "
                     f"{len(gpu.processes)} process(es)")
    for s in stale_gpu_processes(facts):
        lines.append(f"  not the service's: {s.describe()}")
    if g.gpus:
        lines.append(f"driver {g.driver or '?'} (CUDA {newest_cuda(g) or '?'}); stack "
                     f"{t.stack.name} is built for CUDA {t.stack.cuda or '(not stated)'}")
        lines += [f"  {h}" for h in health_lines(g, GpuPolicy.of(t.vars))]
    lines.append(f"disk free under {Path(t.rendered.paths.env_dir).parent}: "
                 f"{facts.disk_free_bytes / GIB:.1f} GiB")
    w = facts.model.weights
    model = "missing" if facts.model.present is False else (
        f"{w.get('present', '?')} weight file(s)"
        + (f", {len(w.get('missing') or [])} of {w.get('listed')} indexed shards absent"
           if w.get("index") else ""))
    lines.append(f"model {t.profile.path}: {model}")
    if facts.model.files is not None:
        lines.append(f"  weights: {weights_summary(facts.model.files)}")
    owners = ", ".join(f"pid {p} {c or '?'}" for p, c in facts.port_owners) or (
        "not visible here" if facts.port_listening else "free")
    lines.append(f"port {t.vars.port}: {owners}")
    lines.append(f"environment: {facts.current_env or '(none)'}; installer: "
                 f"{'uv ' + facts.uv if facts.uv else 'pip'}")
    drifted = findings(t.stack, facts, t.rendered.paths.env_dir)
    if facts.packages is None:
        lines.append(f"stack {t.stack.name}: not installed (deploy installs it)")
    elif drifted:
        lines.append(f"stack {t.stack.name}: drift (deploy repairs it)")
        lines += [f"  {f.describe()}" for f in drifted]
    else:
        lines.append(f"stack {t.stack.name}: as pinned, rules hold")
    lines.append(f"service: {facts.service.active_state or 'not loaded'}"
                 + (f", pid {facts.service.main_pid}" if facts.service.main_pid else ""))
    return lines


@vigil_task(help={
    "model": "model profile; default: the host's `model`",
    "hosts": HOSTS_HELP,
    "stack": "runtime stack; default: the host's `stack`",
    "set": "KEY=VALUE override (repeatable)",
    "kill_stale": "judge as deploy --kill-stale would (stale GPU holders are not refused)",
    "json": json_help("each host's GO / NO-GO, facts and refusals"),
}, iterable=["set_"])
def preflight(c: Context, model: str | None = None, hosts: str = "all",
              stack: str | None = None, set_: list[str] | None = None,
              kill_stale: bool = False, json: JsonFlag = None) -> None:
    """Facts and go/no-go for a deploy; changes nothing."""
    from vigil.deploy import apply as deploy_mod
    from vigil.deploy.gpucheck import GpuPolicy
    from vigil.deploy.preflight import problems
    from vigil.desired import targets as targets_mod
    from vigil.transport.ssh import connect

    out = text_stream(json)
    try:
        targets = targets_mod.resolve(load_inventory(c), hosts, model=model, stack=stack,
                                     sets=set_ or [], require_secrets=False,
                                     template_dir=template_dirs(c))
    except VigilError as exc:
        echo(f"NO-GO  {exc}", file=out)
        emit_json(c, json, {"ok": False, "exit_code": int(exc.exit_code), "error": str(exc),
                            "hosts": {}})
        raise Exit(code=int(exc.exit_code)) from None
    reports: dict[str, tuple[list[str], list[VigilError], VigilError | None]] = {}

    def work(name: str) -> None:
        t = next(x for x in targets if x.name == name)
        try:
            with connect(t.name, t.vars) as transport:
                facts = deploy_mod.gather(transport, t)
        except VigilError as exc:
            reports[name] = ([], [], exc)
            return
        found = problems(t.name, t.profile, t.rendered, facts, kill_stale=kill_stale,
                         stack=t.stack, policy=GpuPolicy.of(t.vars))
        reports[name] = (_facts_lines(t, facts), found, None)

    parallel([t.name for t in targets], work)
    codes: list[int] = []
    hosts_json: dict[str, Any] = {}
    for t in targets:
        lines, found, error = reports[t.name]
        word = failed_word(int(error.exit_code)) if error else "NO-GO" if found else "GO"
        hosts_json[t.name] = {
            "result": word, "profile": t.profile.name, "stack": t.stack.name,
            "facts": lines, "error": None if error is None else str(error),
            "refusals": [{"message": str(r), "exit_code": int(r.exit_code)} for r in found]}
        if error:
            echo(f"{t.name}: {word}  {error}", file=out)
            codes.append(int(error.exit_code))
            continue
        echo(f"{t.name}: {word}  ({t.profile.name} on {t.stack.name})", file=out)
        for line in lines:
            echo(f"  {line}", file=out)
        for refusal in found:
            echo("  refused: " + str(refusal).replace("\n", "\n    "), file=out)
            codes.append(int(refusal.exit_code))
    code = worst_code(codes)
    emit_json(c, json, {"ok": code == 0, "exit_code": code, "hosts": hosts_json})
    if code:
        raise Exit(code=code)


stack = Collection("stack", check)
