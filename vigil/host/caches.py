"""Compile caches between hosts: list a service's cache entries, pack the ones a ready
start used (a blob per entry), take blobs in chunks, seed them, drop a quarantined one.

An entry is one directory vLLM keys by its own hash: ``torch_compile_cache/<hash10>``
(the piecewise backend's graphs with inductor's and Triton's caches beneath) and the AOT
artefact ``torch_compile_cache/torch_aot_compile/<hash64>`` (0.16: ``torch_aot_compile/
<hash64>``), and inductor's precompiled header under /tmp. Seeding adds a whole entry
the host lacks, by one rename into place; it never writes into an entry that exists, so
a cache a running or starting vLLM uses is never touched (vLLM loads only the entry of
its own hash, and checks it).

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
import stat
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
# Inductor's precompiled C++ header (CPU builds, ~150 MB): torch places it under
# /tmp/torchinductor_<user> whatever TORCHINDUCTOR_CACHE_DIR says, and rebuilding it costs
# a cold start ~8 s on the lab. Its file names are content hashes. "_tmp/" marks an entry
# of that directory (the request's tmp_root), not of the cache root.
TMP_ENTRIES = ("_tmp/precompiled_headers",)
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


def _where(rel: str, req: Json) -> str:
    """An entry's directory on this host."""
    if rel in TMP_ENTRIES:
        return os.path.join(str(req["tmp_root"]), rel.split("/", 1)[1])
    return os.path.join(str(req["root"]), rel)


def _real_dir(path: str) -> bool:
    return not os.path.islink(path) and os.path.isdir(path)


def cache_entries(req: Json) -> List[Json]:
    """Every seedable entry on the host: its path, files, bytes and the newest file's
    mtime (which start wrote it)."""
    root = str(req["root"])
    out: List[Json] = []
    names: List[str] = []
    for parent in ENTRY_PARENTS:
        try:
            names += [parent + "/" + n for n in sorted(os.listdir(os.path.join(root, parent)))
                      if _HASH.match(n)]
        except OSError:
            continue
    if req.get("tmp_root") and _real_dir(str(req["tmp_root"])):
        names += list(TMP_ENTRIES)
    for rel in names:
        path = _where(rel, req)
        if not _real_dir(path):
            continue
        if req.get("names"):  # facts: which entries there are, not their size
            out.append({"path": rel})
            continue
        files, size, newest = _tree_size(path)
        if files:
            out.append({"path": rel, "files": files, "bytes": size, "newest": newest})
    return out


def cache_list(req: Json) -> Json:
    return {"entries": cache_entries(req)}


def _entry_ok(rel: str) -> bool:
    if rel in TMP_ENTRIES:
        return True
    parent, _, name = rel.rpartition("/")
    return parent in ENTRY_PARENTS and bool(_HASH.match(name))


def _check_entries(rels: List[str]) -> None:
    bad = [e for e in rels if not _entry_ok(e)]
    if bad:
        raise ValueError("not a cache entry: %s" % ", ".join(bad))


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


def _pack_one(rel: str, req: Json) -> Json:
    src = _where(rel, req)
    tmp = os.path.join(SEED_DIR, ".pack-%s" % os.urandom(8).hex())
    files = 0
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        for base, dirs, names in os.walk(src):
            dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(base, d)))
            arc = os.path.normpath(os.path.join(rel, os.path.relpath(base, src)))
            tar.add(base, arcname=arc, recursive=False)
            for name in sorted(names):
                path = os.path.join(base, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue  # vLLM and torch write plain files; anything else stays
                tar.add(path, arcname=os.path.join(arc, name), recursive=False)
                files += 1
    digest = _sha256(tmp)
    name = digest + ".tar.gz"
    os.replace(tmp, os.path.join(SEED_DIR, name))
    return {"entry": rel, "blob": name, "sha256": digest, "files": files,
            "bytes": os.path.getsize(os.path.join(SEED_DIR, name))}


def cache_pack(req: Json) -> Json:
    """Pack each named entry into its own tar.gz under SEED_DIR (a blob per entry: a host
    is sent only the entries it lacks, a harvest packs only what changed)."""
    wanted = [str(e) for e in req["entries"]]
    _check_entries(wanted)
    os.makedirs(SEED_DIR, mode=0o700, exist_ok=True)
    return {"blobs": [_pack_one(rel, req) for rel in wanted if _real_dir(_where(rel, req))]}


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


def _member_ok(m: tarfile.TarInfo, entry: str) -> Optional[str]:
    """Why a member may not be extracted (None: it may): plain files and directories
    inside the entry only."""
    name = m.name
    if name.startswith("/") or ".." in name.split("/") or "\\" in name:
        return "unsafe path %r" % name
    if not (m.isdir() or m.isreg()):
        return "%r is not a plain file or directory" % name
    if name == entry or name.startswith(entry + "/"):
        return None
    return "%r is outside the entry %s" % (name, entry)


def _owner(user: str) -> Tuple[int, int]:
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def _own_dir(path: str, top: str, uid: int, gid: int) -> Optional[str]:
    """Make the directory an entry goes into (each level from ``top``, the cache root or
    /tmp/torchinductor_<user>, the service user's, as vLLM or torch would have made it),
    or say why it may not be used: in /tmp someone else may have made it first."""
    if not os.path.lexists(path):
        if path == top:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        else:
            why = _own_dir(os.path.dirname(path), top, uid, gid)
            if why is not None:
                return why
        os.mkdir(path, 0o755)
        os.lchown(path, uid, gid)
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, uid):
        return "%s is not a directory of the service user's" % path
    return None


def _seed_one(part: Json, req: Json, uid: int, gid: int) -> Tuple[str, str]:
    """("seeded" | "kept" | a warning, the entry)."""
    rel = str(part["entry"])
    upload = _blob_path(str(part["blob"]))
    dest = _where(rel, req)
    if os.path.lexists(dest):
        _unlink(upload)
        return "kept", rel  # the host has it: never written over
    try:
        digest = _sha256(upload)
    except FileNotFoundError:
        return "the upload %s is missing" % upload, rel
    if digest != part["sha256"]:
        _unlink(upload)
        return "%s: the upload's sha256 is %s, not %s" % (rel, digest[:16],
                                                          str(part["sha256"])[:16]), rel
    parent = os.path.dirname(dest)
    top = str(req["tmp_root"] if rel in TMP_ENTRIES else req["root"])
    why = _own_dir(parent, top, uid, gid)
    if why is not None:
        _unlink(upload)
        return why, rel
    stage = os.path.join(parent, ".vigil-seed-%s" % os.urandom(8).hex())
    os.mkdir(stage, 0o700)
    try:
        with tarfile.open(upload, "r:gz") as tar:
            members = tar.getmembers()
            bad = next((w for w in (_member_ok(m, rel) for m in members) if w), None)
            if bad is not None:
                return "the packed cache holds %s" % bad, rel
            for m in members:
                out = os.path.join(stage, m.name)
                if m.isdir():
                    os.makedirs(out, mode=0o755, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(out), mode=0o755, exist_ok=True)
                data = tar.extractfile(m)
                assert data is not None
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW,
                             m.mode & 0o755 | 0o600)
                with os.fdopen(fd, "wb") as fh:
                    shutil.copyfileobj(data, fh)
                os.utime(out, (m.mtime, m.mtime))  # older than the start: it reads as warm
        for base, dirs, names in os.walk(stage):
            for name in dirs + names:
                os.lchown(os.path.join(base, name), uid, gid)
        os.rename(os.path.join(stage, rel), dest)
        return "seeded", rel
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        _unlink(upload)


def seed(action: Json, paths: Dict[str, str]) -> Json:
    """Seed a cache, entry by entry: check each upload's sha256, unpack it into a staging
    directory beside its place, own it by the service user, rename it into place where
    the host lacks the entry. A mismatch or a bad member seeds that entry not and says
    so; the start then compiles it as it would have (ok: a seed never fails a deploy)."""
    parts = [p for p in action["blobs"] if isinstance(p, dict)]
    _check_entries([str(p["entry"]) for p in parts])
    uid, gid = _owner(str(action["user"]))
    seeded: List[str] = []
    kept: List[str] = []
    warnings: List[str] = []
    for part in parts:
        how, rel = _seed_one(part, action, uid, gid)
        if how == "seeded":
            seeded.append(rel)
        elif how == "kept":
            kept.append(rel)
        else:
            warnings.append(how)
    out: Json = {"ok": True, "seeded": seeded, "kept": kept}
    if warnings:
        out["warning"] = "; ".join(warnings)
    return out


def cache_drop(req: Json) -> Json:
    """Remove entries (a quarantined seed), so the next start compiles them anew."""
    rels = [str(e) for e in req["entries"]]
    _check_entries(rels)
    dropped: List[str] = []
    for rel in rels:
        path = _where(rel, req)
        if _real_dir(path):
            shutil.rmtree(path)
            dropped.append(rel)
    return {"dropped": dropped}
