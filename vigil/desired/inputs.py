"""Reading a local input file (an inventory's YAML or INI, a stack lock, ssh config,
known_hosts): a regular file of bounded size, or one clear error. A FIFO, a device
(/dev/zero) or a directory named where a file belongs never hangs vigil or takes all
its memory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vigil.errors import ConfigError

MAX_INPUT = 64 << 20  # bytes: no inventory file, lock or ssh config comes near it


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read(path: Path, cap: int) -> bytes:
    """The bytes of a regular file (OSError as open raises it; ValueError says why not)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO's open never waits
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{_kind(mode)}, not a regular file")
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise ValueError(f"more than {cap} bytes")
    return data


def read_input(path: Path, cap: int = MAX_INPUT) -> str:
    """A local input's text (UTF-8); ConfigError names the file and why it is not read."""
    try:
        return _read(path, cap).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("cannot read: not UTF-8 text", file=str(path),
                          fix="save it as UTF-8") from None
    except ValueError as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path),
                          fix="name a regular file") from None


def read_optional(path: Path, cap: int = MAX_INPUT) -> str | None:
    """A file read as ssh reads its own (known_hosts, ssh config): its text when it is a
    readable regular file, else None (``/dev/null`` is empty, a FIFO or /dev/zero is
    skipped, never waited on or read whole)."""
    try:
        return _read(path, cap).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
