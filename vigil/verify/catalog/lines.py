"""One log line as it reaches the watcher: ANSI, HTML tags, journald/docker/launcher
wrappers and viewer borders taken off; the process prefix, level and source read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Real escape codes, and the caret form (`^[[0;36m`) a terminal copy leaves.
# vLLM colours its process prefix ("\x1b[1;36m(EngineCore pid=1)\x1b[0;0m"): a page that
# drops the ESC leaves "[1;36m(…)[0;0m" around it (gpustack#3786), removed only there.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|\^\[\[[0-9;]*m"
                   r"|^\[[0-9;]{1,12}m(?=\()|(?<=\))\[[0-9;]{1,12}m")

# Wrappers users paste around vLLM's lines: HTML colour tags, CI gutters ("  | "), a
# bracketed ISO stamp (a launcher's "[2025-09-25 20:03:20] [/bin/sh]: " relaying the
# child's output adds its stream's name), docker compose's "name  | ", FastChat's worker
# relaying its stderr/stdout through its logger ("2024-02-20 21:46:23 | ERROR | stderr | ":
# the relay's level, not the line's; QAnything#128, #302, vllm#9329).
_WRAPPERS = re.compile(
    r"^(?:\s*<[^>]{1,80}>)+|^\s*\|\s"
    r"|^\s*\[\d{4}-\d\d-\d\d[T ][\d:.]{1,20}Z?\](?: \[[^\]\s]{1,40}\]:)?\s?"
    r"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]{4,8} \| std(?:err|out) \| ?"
    r"|^[\w.-]{1,60}\s+\|\s|^\[rank\d+\]:\s?|^\s*[│┃]\s?"
    # docker logs --timestamps (RFC 3339, nanoseconds), a log viewer's or compose's stamp
    # gutter ("2025-05-30 18:28:27.890 | "), kubectl logs --prefix ("[pod/x/c] ")
    r"|^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)\s"
    r"|^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?Z? \| ?"
    r"|^\[pod/[^\]\s]{1,200}\] ")

# One vLLM process prefix: `(APIServer pid=1)`, `(EngineCore_DP0 pid=7)`, `(Worker_TP3
# pid=9)`, ≤0.10's `(VllmWorker TP0 pid=9)`, Ray's `(RayWorkerWrapper pid=12, ip=10.0.0.1)`,
# a harness's `(vllm-test, pid=2150)`; each may sit in colour codes whose ESC a page lost
# ("36m(EngineCore_DP0 pid=820)0m", gpustack#4194). Wrappers stack them (a Ray actor
# relaying its child, a launcher relaying vLLM): the innermost is the process that wrote.
_ONE_PREFIX = re.compile(
    r"^\s*(?:\[?\d{1,2}(?:;\d{1,2})*m)?"
    r"\((?P<name>[A-Za-z][\w\-]*(?:,? [A-Za-z][\w\-]*)?)(?: rank=\d+)?,? pid=(?P<pid>\d+)"
    r"(?P<ip>, ip=[^)\s]{1,60})?\)(?:\[?\d{1,2}(?:;\d{1,2})*m)?\s*")

# Ray's log deduplication: "… [repeated 7x across cluster]" (ray/_private/ray_logging).
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]")

_TAGS = re.compile(r"</?(?:font|b|i|span)[^>]{0,80}>")

# `(APIServer pid=1) INFO 11-29 10:01:02 [file.py:12] msg`; the process prefix is
# optional (absent on tracebacks from 0.31 on), so is the level/stamp/source block; V0
# wrote the source without the opening bracket (`INFO 07-07 20:12:44 metrics.py:295] msg`)
# and Ray adds fields to the process prefix (`(RayWorkerWrapper pid=12, ip=10.0.0.1)`).
_PREFIX = re.compile(
    r"^\s*(?:\((?P<proc>[A-Za-z][\w\-]*)(?: rank=\d+)? pid=(?P<pid>\d+)(?:, ip=[^)]*)?\)\s*)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)?\s+"
    r"(?:\[?(?P<source>[\w.\-/]+:\d+)\]\s*)?)?"
    r"(?P<msg>.*)$",
    re.DOTALL,
)

# Bounded and bracket-free before the source: linear on hostile lines.
_SOURCE_LAST = re.compile(
    r"^(?P<pre>[^\[\]]{0,120}?)\[(?P<source>[\w.\-/]{1,120}\.py:\d{1,6})\]\s?(?P<msg>.*)$",
    re.DOTALL)

# glog's prefix, which C++ runtimes (XLA/TSL on TPU, torch's c10) and torch's own Python
# logging (torch._logging: inductor, dynamo, distributed) write: "Lmmdd hh:mm:ss.uuuuuu
# threadid file:line] msg", L one of I W E F (glog's LogMessage; torch._logging's
# _default_formatter). Torch may add a compile id ("[0/0] ") before the message.
_GLOG = re.compile(
    r"^(?P<lvl>[IWEF])(?P<mo>[01]\d)(?P<day>[0-3]\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d{1,9})? {1,8}"
    r"\d{1,10} (?P<source>[^\s\]]{1,300}:\d{1,6})\] ?(?:\[\d{1,6}/\d{1,6}\](?:_\d{1,6})? )?"
    r"(?P<msg>.*)$", re.DOTALL)
_GLOG_LEVEL = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}

_LEVEL_WORD = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")

@dataclass(frozen=True)
class Line:
    """One log line split into vLLM's prefix fields and the message."""

    proc: str | None
    pid: int | None
    level: str | None
    stamp: str | None  # MM-DD HH:MM:SS, local time, no year
    source: str | None
    message: str

def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)

def _unwrap(text: str) -> str:
    for _ in range(3):
        new = _WRAPPERS.sub("", text, count=1)
        if new == text:
            break
        text = new
    text = _TAGS.sub("", text)
    # a log viewer's right border: by hand, as `\s*[│┃]\s*$` is quadratic on a long run
    # of spaces (20 000 took 2.9 s)
    stripped = text.rstrip()
    return stripped[:-1].rstrip() if stripped.endswith(("│", "┃")) else text

def _prefixes(text: str) -> str:
    """Stacked process prefixes down to the innermost, written as vLLM writes one."""
    last: tuple[str, str, str] | None = None
    for _ in range(4):
        m = _ONE_PREFIX.match(text)
        if m is None:
            break
        last = (m.group("name").replace(",", "").replace(" ", "_"), m.group("pid"),
                m.group("ip") or "")
        text = text[m.end():]
    if last is None:
        return text
    return f"({last[0]} pid={last[1]}{last[2]}) {text}"


def normalise(text: str) -> str:
    """The one line normaliser every reader uses (live journal, replayed file, trace):
    ANSI SGR (real or caret), `\\r` redraws (the last counts) and caret `^M`, paste and
    log-shipper wrappers (journald relays, docker --timestamps, compose and CI gutters,
    kubectl prefixes, `[rankN]:`, HTML tags, viewer borders), stacked process prefixes
    (the innermost kept) and Ray's `[repeated Nx across cluster]`. What is left is the
    line as vLLM wrote it: `(PROC pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] message`.
    Idempotent: normalise(normalise(x)) == normalise(x)."""
    if "repeated" in text:  # Ray's suffix, before a redraw could hide the line under it
        text = _RAY_REPEATED.sub("", text)
    # tqdm redraws with \r: the last redraw is the state that counts.
    clean = strip_ansi(text).rstrip("\r\n")
    if clean.endswith("^M"):  # a CR in caret notation, as a terminal copy leaves it
        clean = clean[:-2]
    if "\r" in clean:
        parts = [p for p in clean.split("\r") if p.strip()]
        clean = parts[-1] if parts else ""
    for _ in range(3):
        before = clean
        clean = _prefixes(_unwrap(clean))
        if clean == before:
            break
    if "repeated" in clean:
        clean = _RAY_REPEATED.sub("", clean)
    return clean


def parse_line(text: str) -> Line:
    clean = normalise(text)
    m = _PREFIX.match(clean)
    if m is None:  # pragma: no cover - the pattern matches any string
        return Line(None, None, None, None, None, clean.strip())
    if m.group("level") is None and m.group("proc") is None:
        gm = _GLOG.match(clean) if clean[:1] in "IWEF" else None
        if gm is not None:
            return Line(None, None, _GLOG_LEVEL[gm.group("lvl")],
                        f"{gm.group('mo')}-{gm.group('day')} {gm.group('hms')}",
                        gm.group("source"), gm.group("msg").strip())
        # A custom logging format (VLLM_LOGGING_CONFIG_PATH, a wrapper's logger) moves the
        # fields around but keeps vLLM's `[file.py:N]` source last: the level is a word
        # before it ("2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] msg").
        sm = _SOURCE_LAST.match(clean)
        level = _LEVEL_WORD.search(sm.group("pre")) if sm else None
        if sm is not None and level is not None:
            return Line(None, None, level.group(0), None, sm.group("source"),
                        sm.group("msg").strip())
    pid = m.group("pid")
    return Line(
        proc=m.group("proc"),
        pid=int(pid) if pid else None,
        level=m.group("level"),
        stamp=m.group("stamp"),
        source=m.group("source"),
        message=m.group("msg").strip(),
    )
