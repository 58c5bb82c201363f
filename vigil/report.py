"""Output for people and pipelines: timestamped lines, per-host summary, JSON."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from vigil.errors import ConfigError


class Log:
    """Timestamped, host-tagged lines; safe to call from the per-host threads."""

    def __init__(self, stream: TextIO | None = None, width: int = 8) -> None:
        self.stream = stream or sys.stdout
        self.width = width
        self._lock = threading.Lock()

    def __call__(self, host: str, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        lines = message.splitlines() or [""]
        with self._lock:
            for line in lines:
                self.stream.write(f"{stamp} {host:<{self.width}} {line}\n")
            self.stream.flush()

    def block(self, text: str) -> None:
        with self._lock:
            self.stream.write(text if text.endswith("\n") else text + "\n")
            self.stream.flush()


@dataclass
class HostResult:
    host: str
    status: str  # ok | changed | failed
    actions: list[str] = field(default_factory=list)
    error: str | None = None
    main_pid: int | None = None
    seconds: float = 0.0
    round_trips: int = 0
    restarted: bool = False
    exit_code: int = 0  # the error's documented code (README: exit codes); 0 when not failed
    verdict: str | None = None  # verify's verdict when the deploy watched a start
    verify: dict[str, Any] | None = None  # verify's JSON (phases, budgets, evidence, smoke)
    # the host kept its running release (backup) before replacing it: a rollback swaps
    # exactly that one back (a plain restart keeps none; a swap would bring an older one)
    replaced: bool = False


def summary_table(results: list[HostResult]) -> str:
    width = max([8, *(len(r.host) for r in results)])
    lines = [f"{'HOST':<{width}}  {'RESULT':<8} {'PID':>8} {'TIME':>8}  DETAIL"]
    for r in results:
        # the full reasons are in the log above and in --json; here, what was done
        done = ", ".join(a.split(":", 1)[0] for a in r.actions)
        detail = r.error.splitlines()[0] if r.error else done or "nothing to do"
        pid = str(r.main_pid) if r.main_pid else "-"
        lines.append(f"{r.host:<{width}}  {r.status:<8} {pid:>8} {r.seconds:>7.1f}s  {detail}")
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "changed", "failed")}
    lines.append(" ".join(f"{k}={v}" for k, v in counts.items()))
    return "\n".join(lines)


def write_text(path: str, text: str) -> None:
    """Write a report file whole or not at all (a reader never sees half a file)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
    except OSError as exc:
        raise ConfigError(f"cannot write: {exc.strerror}", file=path) from None


def write_json(path: str, payload: Any) -> None:
    write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def results_json(results: list[HostResult]) -> dict[str, Any]:
    return {
        "ok": all(r.status != "failed" for r in results),
        "hosts": {r.host: asdict(r) for r in results},
    }
