"""Output for people and pipelines: timestamped lines, per-host summary, JSON."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import sys
import tempfile
import threading
import time
import unicodedata
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from vigil.errors import ConfigError
from vigil.exitcodes import ExitCode

# Anything but tab, newline and printable ASCII is looked at once (the fast path skips
# plain ASCII lines, most of a journal).
_SUSPECT = re.compile(r"[^\t\n\x20-\x7e]")


def _shown(match: re.Match[str]) -> str:
    c = match.group()
    if c.isprintable() or unicodedata.category(c) == "Zs":  # letters, marks, NBSP
        return c
    return c.encode("unicode_escape").decode("ascii")  # \x1b, \r, \x85, \u2028, \udc80


def safe_text(text: str) -> str:
    """Text from a host (a journal line, a unit state, a model name, a file name, a
    hook's stderr) fit to print to a terminal or put in a report: every character a
    terminal or parser would act on instead of show (ESC and so CSI/OSC sequences such
    as a clear, a window title or an OSC 52 clipboard write, BEL, backspace, a lone CR,
    DEL, C1 controls, U+2028/2029, bidi overrides, zero-width marks, lone surrogates) is
    written as Python escapes it (``\x1b``); tab and newline stay, CRLF becomes a
    newline. The result holds only printable characters, tab and newline (so it is also
    legal XML 1.0 and UTF-8), and cleaning it again changes nothing."""
    text = str(text)
    if not _SUSPECT.search(text):
        return text
    return _SUSPECT.sub(_shown, text.replace("\r\n", "\n"))


def echo(text: object = "", *, file: TextIO | None = None) -> None:
    """print() for the tasks: what they print holds host text, so it goes out clean."""
    print(safe_text(str(text)), file=file or sys.stdout)


def _lines(text: str) -> list[str]:
    """Lines at newlines only (after safe_text no other separator is left)."""
    lines = text.split("\n")
    return lines[:-1] if len(lines) > 1 and lines[-1] == "" else lines


class Log:
    """Timestamped, host-tagged lines; safe to call from the per-host threads. Every
    line is cleaned (``safe_text``): journal lines and hook output reach it raw."""

    def __init__(self, stream: TextIO | None = None, width: int = 8) -> None:
        self.stream = stream or sys.stdout
        self.width = width
        self._lock = threading.Lock()

    def __call__(self, host: str, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        lines = _lines(safe_text(message))
        host = safe_text(host).replace("\n", "\\n")  # the tag of one line stays one line
        with self._lock:
            for line in lines:
                self.stream.write(f"{stamp} {host:<{self.width}} {line}\n")
            self.stream.flush()

    def block(self, text: str) -> None:
        text = safe_text(text)
        with self._lock:
            self.stream.write(text if text.endswith("\n") else text + "\n")
            self.stream.flush()


class HostStatus(StrEnum):
    """What a task did on a host: HostResult.status (a node group's GroupResult.status is
    OK, CHANGED or FAILED). A member is its string: the JSON, the JUnit and the summary
    hold the plain value."""

    OK = "ok"  # nothing to change (or --check: nothing would change)
    CHANGED = "changed"  # something was written, installed or restarted (or would be)
    FAILED = "failed"  # a step, the start's watch or a rollback failed; exit_code says how
    SKIPPED = "skipped"  # a rollout's rollback: the deploy had not replaced the release
    ROLLED_BACK = "rolled_back"  # a rollout's rollback: the previous release serves again


@dataclass
class HostResult:
    host: str
    status: HostStatus
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
    # the actions the host completed (kinds), also when a later step failed: what changed
    applied: list[str] = field(default_factory=list)
    # deploy --check: the planned restart's start predicted from history (predict.py's
    # Prediction.to_json, with its `line`)
    prediction: dict[str, Any] | None = None
    # the compile cache carried between hosts (deploy/seed.py): seeded from which host,
    # which entries, what this start's cache was kept as, a quarantine and why
    compile_seed: dict[str, Any] | None = None

    @property
    def unreachable(self) -> bool:
        """Never reached (SSH): nothing ran there."""
        return self.exit_code == ExitCode.UNREACHABLE

    @property
    def code(self) -> int:
        """This host's part of the task's exit code: its error's, or FAILED for a failure
        without one of its own."""
        return self.exit_code or (int(ExitCode.FAILED) if self.status == HostStatus.FAILED
                                  else 0)


def failed_word(exit_code: int, word: str = "FAILED") -> str:
    """How every task names a host it could not reach (one word: UNREACHABLE), else
    ``word``."""
    return "UNREACHABLE" if exit_code == ExitCode.UNREACHABLE else word


def recap(results: list[HostResult]) -> dict[str, int]:
    """Ansible's recap, over hosts: ``changed`` counts every host something was changed
    on, also one that failed after (a failed host with writes is in both), and an
    unreachable host is ``unreachable``, not ``failed``."""
    return {
        "ok": sum(r.status == HostStatus.OK for r in results),
        "changed": sum(r.status == HostStatus.CHANGED
                       or (r.status == HostStatus.FAILED and bool(r.applied))
                       for r in results),
        "unreachable": sum(r.unreachable for r in results),
        "failed": sum(r.status == HostStatus.FAILED and not r.unreachable for r in results),
    }


def result_word(r: HostResult) -> str:
    return failed_word(r.exit_code, r.status) if r.status == HostStatus.FAILED else r.status


def summary_row(r: HostResult, width: int) -> str:
    """A host's line of the deploy summary: HOST RESULT PID TIME DETAIL."""
    # the full reasons are in the log above and in --json; here, what was done
    done = ", ".join(a.split(":", 1)[0] for a in r.actions)
    detail = r.error.splitlines()[0] if r.error else done or "nothing to do"
    if r.prediction and not r.error:
        detail += f", {r.prediction['line']}"
    if r.error and r.applied:
        detail += f" (after {len(r.applied)} change(s): {', '.join(r.applied)})"
    pid = str(r.main_pid) if r.main_pid else "-"
    return f"{r.host:<{width}}  {result_word(r):<11} {pid:>8} {r.seconds:>7.1f}s  {detail}"


def summary_header(width: int) -> str:
    return f"{'HOST':<{width}}  {'RESULT':<11} {'PID':>8} {'TIME':>8}  DETAIL"


def recap_line(results: list[HostResult]) -> str:
    return " ".join(f"{k}={v}" for k, v in recap(results).items())


def summary_table(results: list[HostResult]) -> str:
    width = max([8, *(len(r.host) for r in results)])
    return "\n".join([summary_header(width), *(summary_row(r, width) for r in results),
                      recap_line(results)])


def _stream(target: Path) -> bool:
    """Whether a report path is a stream to write through, never a file to replace: a
    character device or FIFO (``/dev/null``, a named pipe), or anything under /dev or
    /proc (``/dev/stdout`` is a link to the process's fd 1, a redirected log file too)."""
    if os.path.abspath(target).startswith(("/dev/", "/proc/")):
        return True
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would, for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def write_text(path: str, text: str) -> None:
    """Write a report file whole or not at all (a reader never sees half a file): a new
    file of a random name made beside it (O_EXCL, never through a planted link), then
    renamed over it; only a regular file (or none) is replaced. A stream (/dev/stdout,
    /dev/null, a FIFO) is written through and stays what it was."""
    target = Path(path)
    # a lone surrogate in host text must not cost the whole report
    data = text.encode("utf-8", errors="backslashreplace")
    try:
        if _stream(target):
            fd = os.open(target, os.O_WRONLY | os.O_APPEND)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return
        try:
            st: os.stat_result | None = os.stat(target)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ConfigError("cannot write: it is not a regular file (a report replaces "
                              "only a file, or writes through a device or FIFO)", file=path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                   suffix=".tmp")
        try:
            umask = _umask()
            os.fchmod(fd, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~umask)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise ConfigError(f"cannot write: {exc.strerror or exc}", file=path) from None


def open_new(path: Path) -> TextIO:
    """A trace's file, opened for writing without following a link planted at its name (a
    predictable name in a state directory others may write); ConfigError names it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        why = "is a symbolic link; vigil does not write through one" \
            if exc.errno == errno.ELOOP else f"cannot write: {exc.strerror}"
        raise ConfigError(why, file=str(path), fix="remove it, or use another state_dir") \
            from None
    return os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")


def xml_document(root: ET.Element) -> str:
    """The XML text of a report tree (JUnit), every text and attribute cleaned with
    safe_text first: XML 1.0 cannot carry most control characters at all, escaped or
    not, and ElementTree writes them raw, so a journal line with ESC in it would make the
    whole file unreadable to the CI that parses it."""
    for el in root.iter():
        if el.text is not None:
            el.text = safe_text(el.text)
        if el.tail is not None:
            el.tail = safe_text(el.tail)
        el.attrib = {safe_text(k): safe_text(str(v)) for k, v in el.attrib.items()}
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def write_json(path: str, payload: Any) -> None:
    write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def results_json(results: list[HostResult]) -> dict[str, Any]:
    return {
        "ok": all(r.status != HostStatus.FAILED for r in results),
        "recap": recap(results),
        "hosts": {r.host: {**asdict(r), "unreachable": r.unreachable} for r in results},
    }
