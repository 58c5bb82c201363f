"""Role files: which the agent wrote (by hash), their state on the host, ``role_facts``.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import stat
from typing import Any, Callable, Dict, List, Optional

from vigil.host.common import (
    Json,
    Refused,
    _kind,
    open_dir,
    read_json,
    read_regular,
    systemctl_show,
)
from vigil.host.files import _split, write_atomic

# vigil's banner (vigil.desired.render.BANNER): in a world-readable file, it marks one
# vigil wrote; tests/unit/test_attacks.py holds the two equal.
MANAGED_MARKER = "Managed by vigil - edits here are replaced by the next deploy."
# The sha256 of what each user-role file was written with, by path (the newest few), so
# a later plan may show its diff: a file whose content vigil did not write never is.
WRITTEN = "/var/lib/vigil/role-hashes.json"
WRITTEN_KEEP = 8
ROLE_FILE_MAX = 4 * 1024 * 1024


def read_written() -> Dict[str, List[str]]:
    value, _ = read_json(WRITTEN)
    if not isinstance(value, dict):
        return {}
    return dict((str(k), [str(h) for h in v]) for k, v in value.items()
                if isinstance(v, list))


def record_written(path: str, content: str) -> None:
    found = read_written()
    digest = hashlib.sha256(content.encode("utf-8")).hexdigest()
    found[path] = ([digest] + [h for h in found.get(path, []) if h != digest])[:WRITTEN_KEEP]
    write_atomic(WRITTEN, json.dumps(found, sort_keys=True), 0o600)


def file_state(path: str, written: Optional[Dict[str, List[str]]] = None) -> Json:
    """A role file as it is, read without following a symlink (in its folders or at its
    end): kind, mode, owner, size and sha256 (absent: text None and nothing else). Its
    text only when vigil wrote it (the hash recorded at its write, or vigil's banner in
    a world-readable file): a diff never shows a host file vigil did not write."""
    directory, name = _split(path)
    try:
        dfd = open_dir(directory)
    except FileNotFoundError:
        return {"text": None}
    except OSError as exc:
        return {"text": None, "kind": "refused",
                "error": "%s: %s" % (exc.filename or directory, exc.strerror)}
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return {"text": None}
        info: Json = {"text": None, "mode": "%o" % (st.st_mode & 0o7777),
                      "owner": _name(pwd.getpwuid, st.st_uid),
                      "group": _name(grp.getgrgid, st.st_gid), "size": st.st_size}
        if not stat.S_ISREG(st.st_mode):
            info["kind"] = _kind(st.st_mode)
            return info
        info["kind"] = "file"
        try:
            data = read_regular(name, ROLE_FILE_MAX, dir_fd=dfd, nofollow=True)
        except (Refused, OSError) as exc:
            info["error"] = exc.reason if isinstance(exc, Refused) else exc.strerror
            return info
        digest = hashlib.sha256(data).hexdigest()
        info["sha256"] = digest
        try:
            text: Optional[str] = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        recorded = digest in (written or {}).get(path, [])
        marked = text is not None and MANAGED_MARKER in text and bool(st.st_mode & 0o004)
        info["vigil"] = recorded or marked
        if info["vigil"]:
            info["text"] = text
        return info
    finally:
        os.close(dfd)


def _name(lookup: Callable[[int], Any], ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


def role_facts(req: Json) -> Json:
    """User roles' files and units (the roles' own round trip when no service is deployed)."""
    written = read_written()
    return {"files": dict((p, file_state(p, written)) for p in req.get("files", [])),
            "units": dict((u, systemctl_show(u)) for u in req.get("units", []))}
