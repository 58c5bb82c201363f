"""Where a new start begins in a log (systemd's Starting/Scheduled restart lines, vLLM's
version banner and its args line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vigil.verify.catalog.lines import parse_line

# Where one start of vLLM begins, in the order a start prints them (a restart's lines
# come in this order too): systemd scheduling the restart, systemd starting the unit,
# vLLM's version line (≤0.13 "vLLM API server version X", later the logo's "version X"
# or "vLLM server version X, serving model M": log_version_and_model, once per start) and
# its arguments (≤0.8 "args: Namespace(…)", later "non-default args: {…}" from
# log_non_default_args, which the offline LLM class calls too).
START_KINDS: tuple[str, ...] = ("scheduled", "starting", "started", "version", "args")

_SYSTEMD_SCHEDULED = re.compile(
    r"^(?P<unit>[\w@.:\\-]{1,200}?)(?:\.service)?: Scheduled restart job, "
    r"restart counter is at \d+")

# systemd's own start lines, which name the unit since v249 ("Started vllm.service -
# vLLM server."; before, only its description, and vLLM's version line marks the start):
# never vLLM's "Starting to load model" (a vLLM line has a level and a source), uvicorn's
# "Started server process [N]" or a wrapper's "Starting vLLM...".
_SYSTEMD_START = re.compile(
    r"^(?P<what>Starting|Started) (?P<unit>[\w@.:\\-]{1,200}?)(?:\.service\b|(?= |\.{0,3}$))")

_VERSION_LINE = re.compile(r"vLLM (?:API )?server version \S|^[^a-zA-Z]{0,80}version \d+\.\d+")

_ARGS_LINE = re.compile(r"^(?:non-default args: \{|args: Namespace\()")

@dataclass(frozen=True)
class StartLine:
    """A line that begins a start: its kind (START_KINDS) and, for systemd's lines, the
    unit or description it names."""

    kind: str
    unit: str | None = None

def start_line(text: str) -> StartLine | None:
    """The start banner this raw line is, if any (cheap for every other line)."""
    if "version" not in text and "args" not in text and "Start" not in text \
            and "Scheduled restart" not in text:
        return None
    line = parse_line(text)
    msg = line.message
    if line.level is None and line.source is None and line.proc is None:
        m = _SYSTEMD_SCHEDULED.match(msg)
        if m:
            return StartLine("scheduled", m.group("unit"))
        m = _SYSTEMD_START.match(msg)
        if m and ".service" in msg:
            return StartLine("starting" if m.group("what") == "Starting" else "started",
                             m.group("unit"))
    if _ARGS_LINE.match(msg):
        return StartLine("args")
    if _VERSION_LINE.search(msg):
        return StartLine("version")
    return None
