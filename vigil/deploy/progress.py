"""An install's progress as the operator reads it: one line from the host agent's
report (vigil/host/progress.py) while pip or uv runs."""

from __future__ import annotations

from typing import Any


def _size(n: float) -> str:
    for unit, step in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= step:
            return f"{n / step:.1f} {unit}"
    return f"{n:.0f} B"


def describe(p: dict[str, Any]) -> str:
    """e.g. ``install: resolving, 45 requirements found, 41 files fetched (1.2 GB), last
    torch``. Counts the installer has not said yet are left out, never guessed."""
    stage, total = str(p.get("stage", "?")), p.get("total")
    fetched, size = int(p.get("fetched") or 0), float(p.get("bytes") or 0)
    got = f"{fetched}{f' of {total}' if total else ''} fetched" + (
        f" ({_size(size)})" if size else "")
    last = f", last {p['current']}" if p.get("current") else ""
    if stage == "resolving":
        return f"install: resolving, {p.get('collected', 0)} requirements found, {got}{last}"
    if stage == "downloading":
        return f"install: downloading, {got}{last}"
    if stage == "installing":
        return f"install: installing {total} packages" if total else "install: installing"
    if stage == "installed":
        return f"install: {p.get('installed')} packages installed"
    return f"install: {stage}"
