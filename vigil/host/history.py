"""``history`` (the host's start records) and ``logs`` (the journal).

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import json
import os

from vigil.host.common import Json, _int, read_text, run

# -- history and logs -----------------------------------------------------------------


def history(req: Json) -> Json:
    """The host's start history (one JSON line per start) and its CPU count (part of a CPU
    host's budget key); with `append`, first adds that record."""
    path = req["path"]
    if req.get("append") is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(req["append"], sort_keys=True) + "\n")
    text = read_text(path)
    return {"cores": len(os.sched_getaffinity(0)), "text": text if isinstance(text, str) else "",
            "error": "%s: permission denied" % path if isinstance(text, dict) else None}


def logs(req: Json) -> Json:
    """The last `lines` lines of the unit's journal, as `journalctl -o short-iso` shows them."""
    code, out = run(["journalctl", "-u", req["unit"], "-n", str(_int(req.get("lines"), 100)),
                     "--no-pager", "-o", "short-iso"], timeout=60)
    return {"ok": code == 0, "text": out}
