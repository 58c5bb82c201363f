"""What every Invoke task shares: project paths from the config, host-selection help,
user errors as one message and an exit code, and running work on hosts in parallel."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from invoke.context import Context
from invoke.exceptions import Exit

from vigil.desired import inventory
from vigil.errors import ConfigError, InternalError, VigilError
from vigil.exitcodes import ExitCode
from vigil.verify.watch import Settings

ROOT = Path(__file__).resolve().parents[2]
HOSTS_HELP = "host names, group names or 'all', comma separated"
SET_HELP = "KEY=VALUE override of a host variable or profile field (repeatable)"
# One exit-code policy for every task: bad input or a refusal first, then the worst
# verdict (timed out > stalled > crashed > stopped), a stopped rollout, a failed host.
SEVERITY = (ExitCode.BAD_INPUT, ExitCode.TIMED_OUT, ExitCode.STALLED, ExitCode.CRASHED,
            ExitCode.STOPPED, ExitCode.ROLLOUT_STOPPED, ExitCode.FAILED)

T = TypeVar("T")


def setting(c: Context, key: str) -> Path:
    """A path from the `vigil` config section, relative to the project root."""
    value = Path(str(c.config.vigil[key]))
    return value if value.is_absolute() else ROOT / value


def watch_settings(c: Context, poll: float | None = None,
                   stall: float | None = None, probe: str | None = None) -> Settings:
    """The watcher's settings, read here once from the Invoke config (``vigil.poll_s``,
    ``vigil.history_min_samples``, ``vigil.probe``) with --poll/--stall/--probe on top:
    deploy, verify and rollback watch a start the same way."""
    cfg = c.config.vigil
    try:
        # unset: each host's own poll_s (the verify role's default, or the inventory's)
        chosen = poll if poll is not None else cfg.get("poll_s")
        poll_s = None if chosen is None else float(chosen)
        min_samples = int(cfg.get("history_min_samples", 3))
    except (TypeError, ValueError):
        raise ConfigError("not a number", key="vigil.poll_s/history_min_samples",
                          fix="set numbers in invoke.yaml") from None
    bad_poll = poll_s is not None and poll_s <= 0
    if bad_poll or (stall is not None and stall <= 0) or min_samples < 1:
        raise ConfigError("--poll and --stall must be positive seconds and "
                          "history_min_samples at least 1", key="--poll/--stall",
                          fix="e.g. --poll 5 --stall 60")
    mode = str(probe if probe is not None else cfg.get("probe", "stream"))
    if mode not in ("stream", "poll"):
        raise ConfigError(f"probe must be stream or poll, not {mode!r}",
                          key="--probe/vigil.probe", fix="--probe poll (or stream)")
    return Settings(poll_s=poll_s, stall_s=stall, min_samples=min_samples,
                    stream=mode == "stream")


def exit_with(codes: Iterable[int]) -> None:
    """End the task with the most important of its hosts' exit codes (none: 0)."""
    found = {int(c) for c in codes if c}
    for code in SEVERITY:
        if code in found:
            raise Exit(code=int(code))
    if found:
        raise Exit(code=max(found))


def load_inventory(c: Context) -> inventory.Inventory:
    return inventory.load(setting(c, "inventory"), setting(c, "roles"))


@contextmanager
def user_errors() -> Iterator[None]:
    """A user mistake prints one clear message and exits with its code; no traceback."""
    try:
        yield
    except VigilError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise Exit(code=int(exc.exit_code)) from None


def parallel(items: Iterable[T], work: Callable[[T], None]) -> None:
    """Run `work` on every item in its own thread and wait for all of them. An exception
    that escapes `work` (a bug) is raised here once all are done, not lost with its
    thread."""
    crashed: list[VigilError] = []

    def guarded(item: T) -> None:
        try:
            work(item)
        except Exception as exc:
            crashed.append(exc if isinstance(exc, VigilError)
                           else InternalError.of(str(item), exc))

    threads = [threading.Thread(target=guarded, args=(item,)) for item in items]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if crashed:
        raise crashed[0]
