"""Writing on the host: atomic writes, temp names, switching a symlink.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from typing import List, Optional, Tuple

from vigil.host.common import O_NOFOLLOW, _trusted, open_dir


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _split(path: str) -> Tuple[str, str]:
    directory, name = os.path.split(path)
    if not directory.startswith("/") or name in ("", ".", ".."):
        raise ValueError("not an absolute path of a file: %r" % (path,))
    return directory, name


def write_atomic(
    path: str, content: str, mode: int, owner: Optional[Tuple[int, int]] = None
) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory: a reader sees
    old or new, never half, and the rename survives a power cut. The directory is opened
    by open_dir (no symlink another user owns is followed on the way) and every step is
    relative to it, so the file lands in that directory and nowhere else."""
    directory, name = _split(path)
    dfd = open_dir(directory, create=True)
    try:
        clean_temps(dfd)
        tmp = temp_name()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o600,
                     dir_fd=dfd)
        try:
            try:
                os.fchmod(fd, mode)
                if owner is not None:
                    os.fchown(fd, owner[0], owner[1])
                data = content.encode("utf-8")
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        replace_synced(tmp, name, dfd)
    finally:
        os.close(dfd)


def replace_synced(tmp: str, name: str, dir_fd: int) -> None:
    """rename(2) tmp over name in the open directory (atomic), then sync the directory;
    a failed rename leaves no temp behind."""
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


# What a write killed between creating its temp file and the rename leaves (SIGKILL,
# power cut): removed by the next write there, once old enough not to be another
# writer's. Only names of exactly this form are vigil's: .vigil-tmp- and 16 hex digits.
TEMP_PREFIX = ".vigil-tmp-"
TEMP_NAME = re.compile(r"\.vigil-tmp-[0-9a-f]{16}\Z")
TEMP_AGE_S = 60.0


def temp_name() -> str:
    return TEMP_PREFIX + os.urandom(8).hex()


def clean_temps(dir_fd: int) -> List[str]:
    """Remove this agent's stale temp files (regular files or links it owns) in the open
    directory; any other name is left alone."""
    removed: List[str] = []
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if not TEMP_NAME.match(name):
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)) \
                    or not _trusted(st.st_uid) or now - st.st_mtime <= TEMP_AGE_S:
                continue
            os.unlink(name, dir_fd=dir_fd)
            removed.append(name)
        except OSError:
            continue
    return removed


def switch_link(link: str, target: str) -> None:
    directory, name = _split(link)
    dfd = open_dir(directory, create=True)
    try:
        clean_temps(dfd)
        tmp = temp_name()
        os.symlink(target, tmp, dir_fd=dfd)
        replace_synced(tmp, name, dfd)
    finally:
        os.close(dfd)
