"""The running service on each host, through the agent: status, journal, rollback.

Each function is one library call a task makes; the agent requests and the paths they
name are built here, never in a task.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from vigil.deploy.plan import exec_words
from vigil.desired.config import HostVars
from vigil.desired.inventory import Inventory
from vigil.desired.render import CACHE_ROOT, SMOKE_SECRETS, check_secrets, service_paths
from vigil.desired.render import api_key as render_api_key
from vigil.errors import HostError, InternalError, VigilError
from vigil.transport.base import Transport, privileged
from vigil.transport.lock import deploy_lock
from vigil.transport.remote import call
from vigil.transport.ssh import connect
from vigil.verify import systemd, watch
from vigil.verify.reducer import Verdict
from vigil.verify.report import Reporter

T = TypeVar("T")


@dataclass
class HostRun(Generic[T]):
    """One host's result, or the error that stopped it (never both)."""

    host: str
    value: T | None = None
    error: VigilError | None = None


def on_hosts(inv: Inventory, hosts: str,
             work: Callable[[str, HostVars, Transport], T]) -> list[HostRun[T]]:
    """Run `work` on every selected host in parallel, each over its own connection; the
    results in the inventory's order."""
    chosen = [(name, inv.host_vars(name)) for name in inv.select(hosts)]

    def one(item: tuple[str, HostVars]) -> HostRun[T]:
        name, hv = item
        try:
            with connect(name, hv) as transport:
                return HostRun(name, value=work(name, hv, transport))
        except VigilError as exc:
            return HostRun(name, error=exc)
        except Exception as exc:  # a bug fails this host, not the whole run
            return HostRun(name, error=InternalError.of(name, exc))

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(chosen)))) as pool:
        return list(pool.map(one, chosen))


def exec_flag(exec_start: str, *names: str) -> str | None:
    """The value of the first `--name=value` word of an ExecStart line."""
    words = exec_words(exec_start) if exec_start else []
    if words is None:  # a unit vigil did not write (6 MB, unbalanced quotes): no value
        return None
    for name in names:
        value = next((w.split("=", 1)[1] for w in words if w.startswith(f"--{name}=")), None)
        if value:
            return value
    return None


# -- status ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    active_state: str
    sub_state: str
    main_pid: str
    uptime_s: float | None
    port: str | None
    health: int | None
    model: str | None  # the model path the unit serves
    served_name: str | None  # what a completion must name

    def line(self) -> str:
        up = self.uptime_s
        uptime = (f"{int(up // 3600)}h{int(up % 3600 // 60):02d}m{int(up % 60):02d}s"
                  if up else "-")
        return (f"{self.active_state or '?'}/{self.sub_state or '?':<9} "
                f"pid {self.main_pid or '-':<7} up {uptime:<10} port {self.port or '-':<5} "
                f"health {self.health or '-':<4} model {self.model or '-'}")


def _seconds(value: object) -> float | None:
    """A duration the host reported, or None where it is none (NaN, inf, "abc", < 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < 1e12 else None


def _code(value: object) -> int | None:
    """An HTTP status the host reported, or None where it is none."""
    return value if isinstance(value, int) and not isinstance(value, bool) \
        and 0 <= value < 1000 else None


def status(transport: Transport, hv: HostVars) -> Status:
    """The unit's state, uptime, what its unit file serves and /health: one round trip.
    A systemctl that cannot answer is the host's failure, with its words."""
    reply = call(transport, hv, "status", {
        "unit": hv.service, "port": hv.port, "unit_path": service_paths(hv)["unit"]})
    svc: dict[str, Any] = reply["service"]
    if svc.get("error"):
        error = str(svc["error"])
        raise HostError(transport.name, f"systemctl cannot answer for {hv.service}: {error}",
                        fix=systemd.FIX if systemd.no_systemd(error)
                        else "run `systemctl status` on the host")
    exec_start = str(reply.get("exec_start") or "")
    return Status(
        active_state=str(svc.get("ActiveState", "")), sub_state=str(svc.get("SubState", "")),
        main_pid=str(svc.get("MainPID", "")), uptime_s=_seconds(reply.get("uptime_s")),
        port=exec_flag(exec_start, "port"), health=_code(reply.get("health")),
        model=exec_flag(exec_start, "model"),
        served_name=exec_flag(exec_start, "served-model-name", "model"))


# -- logs -----------------------------------------------------------------------------


def journal(transport: Transport, hv: HostVars, lines: int) -> str:
    """The last `lines` lines of the service's journal: one round trip."""
    return str(call(transport, hv, "logs", {"unit": hv.service, "lines": lines},
                    timeout=60).get("text") or "")


def follow(transport: Transport, hv: HostVars, lines: int,
           emit: Callable[[str], None]) -> None:
    """Print the journal as it grows until the connection ends (`journalctl -f` is a
    stream, not one JSON reply: the one thing on the host that is not an agent verb)."""
    held = transport.hold(privileged(
        f"journalctl -u {shlex.quote(hv.service)} -n {int(lines)} --no-pager -o short-iso -f",
        hv, transport))
    try:
        while (line := held.readline(timeout=3600)) != "":
            if line:
                emit(line.rstrip("\n"))
    finally:
        held.release()


# -- rollback -------------------------------------------------------------------------


def probe_target(hv: HostVars, served: str, api_key: str | None) -> watch.ProbeTarget:
    """What the watcher needs of a service the inventory no longer describes (the
    restored release): paths from the host's variables, the model from its unit."""
    return watch.ProbeTarget(
        unit=hv.service, port=hv.port, user=hv.service_user,
        cache_dir=f"{CACHE_ROOT}/{hv.service}", python=f"{hv.env_root}/current/bin/python",
        model=served, api_key=api_key)


def rollback(transport: Transport, hv: HostVars, *, wait: bool, settings: watch.Settings,
             state_dir: Path, log: Callable[[str, str], None], api_key: str | None = None,
             ) -> watch.Outcome | None:
    """Swap the kept release back in and restart it, under the deploy lock like deploy (a
    rollback never swaps files under a deploy); with `wait`, watch the start with the
    verify watcher and return its outcome (judge it with `ready_pid`). Its smoke sends
    ``api_key`` (a rollout's: the target's rendered key) or else VLLM_API_KEY as render
    writes it for this host, secret_env from this environment — the key deploy's and
    verify's smoke send; a key secret_env names but this environment lacks is refused
    before anything is swapped."""
    name = transport.name
    if wait and api_key is None:
        check_secrets(name, hv, os.environ, SMOKE_SECRETS)
        api_key = render_api_key(hv, os.environ)
    with deploy_lock(transport, hv, lambda message: log(name, message)):
        reply = call(transport, hv, "rollback",
                     {"unit": hv.service, "paths": service_paths(hv)}, timeout=600)
        if not reply["ok"]:
            raise HostError(name, f"rollback failed: {reply['error']}")
        log(name, f"restored {', '.join(reply['restored'])}; restarted")
        if not wait:
            return None
        served = status(transport, hv).served_name or ""
        return watch.watch_service(name, transport, probe_target(hv, served, api_key), settings,
                                   state_dir, poll_s=hv.poll_s,
                                   privileged_fn=lambda cmd: privileged(cmd, hv, transport),
                                   on_poll=Reporter(live=False, emit=log).poll)


def ready_pid(name: str, out: watch.Outcome) -> int | None:
    """The main PID of a restored release proven ready; otherwise the error that says why."""
    if out.error is not None:
        raise VigilError(out.error)
    st = out.state
    assert st is not None
    if st.verdict != Verdict.READY:
        raise HostError(name, f"after rollback: {st.verdict} ({st.cause}): {st.proof}",
                        fix=st.remedy)
    return st.main_pid
