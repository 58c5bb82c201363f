"""An install's progress as the operator reads it: one line from the host agent's
report (vigil/host/progress.py) while pip or uv runs. A host's report is input: numbers
that are no counts, text that is no name, and a flood of lines are read as such."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

_MAX = 10**15  # no install fetches more files or bytes than this


def _count(v: object) -> int | None:
    """A count the host reported, or None (not a number, negative, NaN, 400 digits)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v) if 0 <= v <= _MAX else None


def _name(v: object) -> str:
    return "".join(c for c in str(v)[:120] if c.isprintable())


def _size(n: float) -> str:
    for unit, step in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= step:
            return f"{n / step:.1f} {unit}"
    return f"{n:.0f} B"


def describe(p: dict[str, Any]) -> str:
    """e.g. ``install: resolving, 45 requirements found, 41 files fetched (1.2 GB), last
    torch``. Counts the installer has not said yet are left out, never guessed."""
    stage, total = _name(p.get("stage", "?")), _count(p.get("total"))
    fetched, size = _count(p.get("fetched")) or 0, _count(p.get("bytes")) or 0
    got = f"{fetched}{f' of {total}' if total else ''} fetched" + (
        f" ({_size(size)})" if size else "")
    last = f", last {_name(p['current'])}" if p.get("current") else ""
    if stage == "resolving":
        return f"install: resolving, {_count(p.get('collected')) or 0} requirements found, " \
            f"{got}{last}"
    if stage == "downloading":
        return f"install: downloading, {got}{last}"
    if stage == "installing":
        return f"install: installing {total} packages" if total else "install: installing"
    if stage == "installed":
        return f"install: {_count(p.get('installed')) or 0} packages installed"
    return f"install: {stage}"


class Told:
    """Says an install's progress at most once per ``every`` seconds, and a stage change
    at once: a host that floods its report (200,000 lines) costs the terminal nothing."""

    def __init__(self, say: Callable[[str], None], every: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.say, self.every, self.clock = say, every, clock
        self.last: tuple[str, float] | None = None
        self.stage = ""

    def __call__(self, p: dict[str, Any]) -> None:
        line, now, stage = describe(p), self.clock(), _name(p.get("stage", ""))
        if self.last is not None and (line == self.last[0] or (
                stage == self.stage and now - self.last[1] < self.every)):
            return
        self.last, self.stage = (line, now), stage
        self.say(line)
