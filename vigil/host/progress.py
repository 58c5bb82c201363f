"""An install's progress, read from the installer's own log while it runs.

pip and uv print nothing a person could follow for minutes (a vLLM stack is 150
packages, 3.5 GB); their log lines say where they are. ``InstallProgress`` reads them
(pip: ``Collecting``, ``Downloading``/``Using cached``/``Processing``, ``Installing
collected packages: …``, ``Successfully installed``; uv: ``Resolved N packages``,
``Downloading``/``Downloaded``, ``Prepared N``, ``Installed N``) and ``follow`` sends
a line to stderr when the stage changes or every few seconds, for the controller to
show (vigil/transport/remote.py passes them on as they come).

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import IO, Any, List, Optional

from vigil.host.common import Json

# a stderr line of the agent's that is progress, not an error
PROGRESS_MARK = "vigil-progress "
PROGRESS_EVERY_S = 15.0  # within a stage, at most one line per interval
PROGRESS_POLL_S = 1.0

_SIZE = re.compile(r"\((\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|k|M|G)?B\)")
_UNIT = {None: 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 1024.0, "Mi": 1024.0 ** 2,
         "Gi": 1024.0 ** 3}
_UV_COUNT = re.compile(r"^(Resolved|Prepared|Installed) (\d+) packages? in ")
# pip indents its Downloading / Using cached under their Collecting line; uv's own
# "Downloading NAME (SIZE)" starts the line and is counted once, at " Downloaded NAME"
_PIP_GOT = re.compile(r"^(?:\s+(?:Downloading|Using cached)|Processing) (\S+)")
_UV_DOWNLOADING = re.compile(r"^Downloading (\S+)")
_UV_DOWNLOADED = re.compile(r"^ Downloaded (\S+)")


class InstallProgress:
    """Where an install is, from its log lines, one line at a time."""

    def __init__(self) -> None:
        self.stage = "starting"
        self.collected = 0  # pip: requirements found so far (the total is known late)
        self.fetched = 0  # files downloaded, taken from the cache, or local
        self.bytes = 0.0  # the sizes the installer printed for them
        self.total: Optional[int] = None  # packages to install, once the installer says
        self.installed: Optional[int] = None
        self.current = ""  # the last package named

    def feed(self, line: str) -> None:
        uv = _UV_COUNT.match(line)
        if uv:
            word, n = uv.group(1), int(uv.group(2))
            if word == "Resolved":
                self.stage, self.total = "downloading", n
            elif word == "Prepared":
                self.stage, self.fetched = "installing", n
            else:
                self.stage, self.installed = "installed", n
            return
        if line.startswith("Collecting "):
            self.stage = "resolving"
            self.collected += 1
            self.current = line.split()[1]
            return
        if line.startswith("Installing collected packages: "):
            names = [n for n in line.split(":", 1)[1].split(",") if n.strip()]
            self.stage, self.total = "installing", len(names)
            return
        if line.startswith("Successfully installed "):
            self.stage, self.installed = "installed", len(line.split()) - 2
            return
        done = _UV_DOWNLOADED.match(line)
        if done:
            self.fetched += 1
            self.current = done.group(1)
            return
        pip = _PIP_GOT.match(line)
        got = pip or _UV_DOWNLOADING.match(line)
        if got:
            size = _SIZE.search(line)
            if size:
                self.bytes += float(size.group(1)) * _UNIT[size.group(2)]
            if pip:
                self.fetched += 1
            elif self.stage == "starting":
                self.stage = "downloading"
            if pip or not self.current:
                self.current = got.group(1).rsplit("/", 1)[-1]

    def summary(self) -> Json:
        return {"stage": self.stage, "collected": self.collected, "fetched": self.fetched,
                "bytes": int(self.bytes), "total": self.total, "installed": self.installed,
                "current": self.current}


def follow(proc: "subprocess.Popen[bytes]", log: str, out: IO[str] = sys.stderr,
           clock: Any = time.monotonic) -> int:
    """Wait for the installer, reading its log as it grows; a progress line on ``out``
    when the stage changes, else at most every PROGRESS_EVERY_S while it changes."""
    progress = InstallProgress()
    offset, rest, said, last = 0, "", None, 0.0
    while True:
        try:
            code: Optional[int] = proc.wait(PROGRESS_POLL_S)
        except subprocess.TimeoutExpired:
            code = None
        with open(log, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        offset += len(chunk)
        lines: List[str] = (rest + chunk.decode("utf-8", "replace")).split("\n")
        rest = lines.pop()
        for line in lines:
            progress.feed(line.rstrip("\r"))
        now, summary = clock(), progress.summary()
        new_stage = said is None or summary["stage"] != said["stage"]
        if summary != said and (new_stage or now - last >= PROGRESS_EVERY_S or code is not None):
            out.write(PROGRESS_MARK + json.dumps(summary) + "\n")
            out.flush()
            said, last = summary, now
        if code is not None:
            return code
