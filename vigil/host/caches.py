"""Compile caches between hosts: list a service's cache entries, pack the ones a ready
start wrote, take a packed cache in chunks, seed it, drop a quarantined one.

An entry is one directory vLLM keys by its own hash: ``torch_compile_cache/<hash10>``
(the piecewise backend's graphs with inductor's and Triton's caches beneath) and the AOT
artefact ``torch_compile_cache/torch_aot_compile/<hash64>`` (0.16: ``torch_aot_compile/
<hash64>``). Seeding adds a whole entry the host lacks, by one rename into place; it never
writes into an entry that exists, so a cache a running or starting vLLM uses is never
touched (vLLM loads only the entry of its own hash, and checks it).

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import pwd
import re
import shutil
import tarfile
from typing import Dict, List, Optional, Tuple

from vigil.host.common import O_NOFOLLOW, Json

# Where packed caches wait on a host (root-only): the pack before the controller reads
# it, the upload before the seed unpacks it.
SEED_DIR = "/var/lib/vigil/seed"
# The parents under which vLLM keeps one directory per hash, and the one name among them
# that is not a hash (0.32+ keeps the AOT artefacts inside torch_compile_cache).
ENTRY_PARENTS = ("torch_compile_cache", "torch_compile_cache/torch_aot_compile",
                 "torch_aot_compile")
_HASH = re.compile(r"[0-9a-f]{8,64}\Z")
_BLOB = re.compile(r"[0-9a-f]{16,64}\.tar\.gz\Z")
CHUNK_MAX = 16 * 1024 * 1024


def _tree_size(path: str) -> Tuple[int, int, float]:
    files = size = 0
    newest = 0.0
    for base, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(base, d))]
        for name in names:
            try:
                st = os.lstat(os.path.join(base, name))
            except OSError:
                continue
            files += 1
            size += st.st_size
            newest = max(newest, st.st_mtime)
    return files, size, newest


def entries(root: str) -> List[Json]:
    """Every hash-keyed entry under the cache root: its path, files, bytes and the
    newest file's mtime (which start wrote it)."""
    out: List[Json] = []
    for parent in ENTRY_PARENTS:
        where = os.path.join(root, parent)
        try:
            names = sorted(os.listdir(where))
        except OSError:
            continue
        for name in names:
            path = os.path.join(where, name)
            if not _HASH.match(name) or os.path.islink(path) or not os.path.isdir(path):
                continue
            files, size, newest = _tree_size(path)
            out.append({"path": parent + "/" + name, "files": files, "bytes": size,
                        "newest": newest})
    return out


def cache_list(req: Json) -> Json:
    return {"entries": entries(req["root"])}


def _entry_ok(rel: str) -> bool:
    parent, _, name = rel.rpartition("/")
    return parent in ENTRY_PARENTS and bool(_HASH.match(name))


def _blob_path(name: str) -> str:
    if not _BLOB.match(name):
        raise ValueError("not a cache blob name: %r" % (name,))
    return os.path.join(SEED_DIR, name)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_pack(req: Json) -> Json:
    """Pack the named entries into one tar.gz under SEED_DIR: its name, sha256 and size."""
    root = req["root"]
    wanted = [str(e) for e in req["entries"]]
    bad = [e for e in wanted if not _entry_ok(e)]
    if bad:
        raise ValueError("not cache entries: %s" % ", ".join(bad))
    os.makedirs(SEED_DIR, mode=0o700, exist_ok=True)
    tmp = os.path.join(SEED_DIR, ".pack-%s" % os.urandom(8).hex())
    files = 0
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        for rel in wanted:
            src = os.path.join(root, rel)
            if os.path.islink(src) or not os.path.isdir(src):
                continue
            for base, dirs, names in os.walk(src):
                dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(base, d)))
                arc = os.path.relpath(base, root)
                tar.add(base, arcname=arc, recursive=False)
                for name in sorted(names):
                    path = os.path.join(base, name)
                    if os.path.islink(path) or not os.path.isfile(path):
                        continue  # vLLM writes plain files; anything else stays home
                    tar.add(path, arcname=os.path.join(arc, name), recursive=False)
                    files += 1
    digest = _sha256(tmp)
    name = digest + ".tar.gz"
    os.replace(tmp, os.path.join(SEED_DIR, name))
    return {"blob": name, "sha256": digest, "bytes": os.path.getsize(os.path.join(SEED_DIR, name)),
            "files": files}


def cache_read(req: Json) -> Json:
    """One chunk of a packed cache, base64; ``done`` removes the blob instead."""
    path = _blob_path(str(req["blob"]))
    if req.get("done"):
        _unlink(path)
        return {"ok": True}
    size = min(int(req["size"]), CHUNK_MAX)
    with open(path, "rb") as fh:
        fh.seek(int(req["offset"]))
        data = fh.read(size)
    return {"data": base64.b64encode(data).decode("ascii"), "eof": len(data) < size}


def cache_write(req: Json) -> Json:
    """Append one base64 chunk to an upload; offset 0 starts it anew (never through a
    link someone planted there)."""
    path = _blob_path(str(req["blob"]))
    os.makedirs(SEED_DIR, mode=0o700, exist_ok=True)
    offset = int(req["offset"])
    flags = os.O_WRONLY | O_NOFOLLOW
    if offset == 0:
        _unlink(path)
        flags |= os.O_CREAT | os.O_EXCL
    fd = os.open(path, flags, 0o600)
    try:
        if os.fstat(fd).st_size != offset:
            raise ValueError("upload %s holds %d bytes, the chunk starts at %d" % (
                path, os.fstat(fd).st_size, offset))
        os.lseek(fd, offset, os.SEEK_SET)
        os.write(fd, base64.b64decode(str(req["data"])))
    finally:
        os.close(fd)
    return {"ok": True, "bytes": os.path.getsize(path)}


def _member_ok(m: tarfile.TarInfo, allowed: List[str]) -> Optional[str]:
    """Why a member may not be extracted (None: it may): plain files and directories
    inside the listed entries only."""
    name = m.name
    if name.startswith("/") or ".." in name.split("/") or "\\" in name:
        return "unsafe path %r" % name
    if not (m.isdir() or m.isreg()):
        return "%r is not a plain file or directory" % name
    if any(name == e or name.startswith(e + "/") for e in allowed):
        return None
    return "%r is outside the seeded entries" % name


def _owner(user: str) -> Tuple[int, int]:
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def seed(action: Json, paths: Dict[str, str]) -> Json:
    """Seed a cache: check the upload's sha256, unpack it into a staging directory under
    the cache root, own it by the service user, rename each entry the host lacks into
    place. A mismatch or a bad member seeds nothing and says so; the start then compiles
    as it would have (ok: a seed is never why a deploy fails)."""
    root = str(action["root"])
    upload = _blob_path(str(action["blob"]))
    allowed = [str(e) for e in action["entries"]]
    bad = [e for e in allowed if not _entry_ok(e)]
    if bad:
        raise ValueError("not cache entries: %s" % ", ".join(bad))
    try:
        digest = _sha256(upload)
    except FileNotFoundError:
        return {"ok": True, "seeded": [], "warning": "the upload %s is missing" % upload}
    if digest != action["sha256"]:
        os.unlink(upload)
        return {"ok": True, "seeded": [], "warning": "the upload's sha256 is %s, not %s: "
                "nothing seeded" % (digest[:16], str(action["sha256"])[:16])}
    uid, gid = _owner(str(action["user"]))
    os.makedirs(root, mode=0o755, exist_ok=True)
    stage = os.path.join(root, ".vigil-seed-%s" % os.urandom(8).hex())
    os.mkdir(stage, 0o700)
    seeded: List[str] = []
    kept: List[str] = []
    try:
        with tarfile.open(upload, "r:gz") as tar:
            members = tar.getmembers()
            why = next((w for w in (_member_ok(m, allowed) for m in members) if w), None)
            if why is not None:
                return {"ok": True, "seeded": [], "warning": "the packed cache holds %s: "
                        "nothing seeded" % why}
            for m in members:
                dest = os.path.join(stage, m.name)
                if m.isdir():
                    os.makedirs(dest, mode=0o755, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
                data = tar.extractfile(m)
                assert data is not None
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW,
                             m.mode & 0o755 | 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(data, out)
                os.utime(dest, (m.mtime, m.mtime))
        for base, dirs, names in os.walk(stage):
            for name in dirs + names:
                os.lchown(os.path.join(base, name), uid, gid)
        for rel in allowed:
            src, dest = os.path.join(stage, rel), os.path.join(root, rel)
            if not os.path.isdir(src):
                continue
            if os.path.lexists(dest):
                kept.append(rel)  # the host has it: never written over
                continue
            os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
            parent = os.path.dirname(rel)
            while parent:  # the parents vLLM would have made, the service user's
                os.lchown(os.path.join(root, parent), uid, gid)
                parent = os.path.dirname(parent)
            os.rename(src, dest)
            seeded.append(rel)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        _unlink(upload)
    return {"ok": True, "seeded": seeded, "kept": kept}


def cache_drop(req: Json) -> Json:
    """Remove entries (a quarantined seed), so the next start compiles them anew."""
    root = req["root"]
    dropped: List[str] = []
    for rel in [str(e) for e in req["entries"]]:
        if not _entry_ok(rel):
            raise ValueError("not a cache entry: %r" % rel)
        path = os.path.join(root, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            dropped.append(rel)
    return {"dropped": dropped}
