"""One inode for identical files across the lab hosts' environments.

Every lab host builds its own vLLM environment (3.5 GB, most of it torch's libraries)
from the same wheels, so ten hosts on one disk would hold ten copies: a fresh CI machine
ran out of disk half-way through the suite. On a real fleet each host has its own disk;
here the copies are an artefact of many hosts on one filesystem, so the lab links them.

Safe because nothing writes into an installed environment in place: pip and uv replace
a file by unlinking it and writing a new one, which leaves the other hosts' links alone.
Only files of ``MIN_SIZE`` or more are considered (87% of an environment's bytes in a
fraction of its files); a file is linked only to one of the same size, content, mode and
owner, and never a log (written in place). Hashes are kept by inode in ``dedupe.json``
so each new file is read once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections import defaultdict
from pathlib import Path

MIN_SIZE = 64 * 1024
# Written in place (appended to by the installer, or by the agent's next install of the
# same environment): one inode would make every host's copy show the last writer's lines.
IN_PLACE = (".log",)
INDEX = "dedupe.json"


def _files(roots: list[Path]) -> dict[int, list[tuple[str, os.stat_result]]]:
    """Regular files of at least MIN_SIZE under `roots`, by size (symlinks not followed)."""
    by_size: dict[int, list[tuple[str, os.stat_result]]] = defaultdict(list)
    for root in roots:
        for top, _dirs, names in os.walk(root):
            for name in names:
                if name.endswith(IN_PLACE):
                    continue
                path = os.path.join(top, name)
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode) and st.st_size >= MIN_SIZE:
                        by_size[st.st_size].append((path, st))
    return by_size


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def link_identical(roots: list[Path], index: Path) -> int:
    """Replace each duplicate file under `roots` by a hard link to its first copy; the
    bytes freed. An unreadable or vanished file is left as it is."""
    try:
        known: dict[str, str] = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    seen: dict[str, str] = {}
    freed = 0
    for size, files in _files(roots).items():
        if len({st.st_ino for _, st in files}) < 2:
            continue
        first: dict[tuple[str, int, int, int], tuple[str, int]] = {}
        for path, st in sorted(files, key=lambda f: f[1].st_ino):
            key = f"{st.st_dev}:{st.st_ino}:{size}:{st.st_mtime_ns}"
            try:
                digest = known.get(key) or _digest(path)
            except OSError:
                continue
            seen[key] = digest
            same = (digest, st.st_mode, st.st_uid, st.st_gid)
            keep = first.setdefault(same, (path, st.st_ino))
            if keep[1] == st.st_ino:
                continue
            tmp = f"{path}.lab-link"
            try:
                os.link(keep[0], tmp)
                os.replace(tmp, path)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                continue
            if st.st_nlink == 1:
                freed += size
    index.write_text(json.dumps(seen))
    return freed


def env_roots(lab: Path) -> list[Path]:
    """Where the lab hosts keep environments and installer caches."""
    hosts = lab / "hosts"
    if not hosts.is_dir():
        return []
    found = [*hosts.glob("*/opt-vigil"), *hosts.glob("*/var-cache-vigil/uv")]
    return sorted(p for p in found if p.is_dir())
