"""Compile caches between hosts: list a service's cache entries, pack the ones a ready
start used (a blob per entry), take blobs in chunks, seed them, drop a quarantined one.

An entry is one directory vLLM keys by its own hash: ``torch_compile_cache/<hash10>``
(the piecewise backend's graphs with inductor's and Triton's caches beneath) and the AOT
artefact ``torch_compile_cache/torch_aot_compile/<hash64>`` (0.16: ``torch_aot_compile/
<hash64>``), and inductor's precompiled header under /tmp. Seeding adds a whole entry
the host lacks, by one rename into place; it never writes into an entry that exists, so
a cache a running or starting vLLM uses is never touched (vLLM loads only the entry of
its own hash, and checks it).

Whatever touches a directory the service user controls (its cache root, its directory
in /tmp) runs as that user (``as_user``): root checks an upload's sha256 in its own
SEED_DIR and hands the child an open descriptor. A process of the service user that
renames or links things mid-seed reaches only what it could reach itself.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import tarfile
import zlib
from typing import IO, Callable, Dict, List, Optional, Tuple

from vigil.host.common import O_NOFOLLOW, O_NONBLOCK, Json

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
# What one entry may unpack to, whatever its pack or the controller says: a kept entry on
# the lab is ~150 MB and ~2,000 files; the biggest seen on a GPU host a few GB.
UNPACK_MAX_BYTES = 64 << 30
UNPACK_MAX_FILES = 500000
FREE_MARGIN = 1 << 30  # left free on the cache's filesystem after a seed


def _owner(user: str) -> Tuple[int, int]:
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def _real_path(top: str, rel: str = "") -> bool:
    """Whether ``top/rel`` is a directory reached through real directories only: no
    component from ``top`` down (``top`` included) is a symlink. A link planted anywhere
    on the way (``torch_compile_cache -> /rootonly``) makes it not an entry."""
    paths = [top]
    for name in (p for p in rel.split("/") if p):
        paths.append(os.path.join(paths[-1], name))
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            return False
    return True


def as_user(uid: int, gid: int, work: Callable[[], Json]) -> Json:
    """``work()`` in a child that holds the service user's uid and gid and no other group,
    its JSON reply through a pipe. What it reads, writes, renames or removes, that user
    could have done itself: root never acts by path inside a directory the user controls
    (where a rename or a planted link behind a check would turn root's chown or read onto
    a file of root's). An exception is ``{"error": ...}``. The same user: in this process."""
    if os.geteuid() == uid:
        try:
            return work()
        except Exception as exc:  # one entry's failure is its reply
            return {"error": "%s: %s" % (type(exc).__name__, exc)}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the agent
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.umask(0o022)
            try:
                out = work()
            except Exception as exc:
                out = {"error": "%s: %s" % (type(exc).__name__, exc)}
            data = json.dumps(out).encode("utf-8")
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    chunks: List[bytes] = []
    with os.fdopen(r, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            chunks.append(block)
    _, status = os.waitpid(pid, 0)
    try:
        reply = json.loads(b"".join(chunks).decode("utf-8"))
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        return {"error": "the service user's child ended without a reply (status %d)" % status}
    return reply
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


def _top(rel: str, req: Json) -> Tuple[str, str]:
    """(the directory an entry lives under, its path below it): the cache root, or
    /tmp/torchinductor_<user> for the header."""
    if rel in TMP_ENTRIES:
        return str(req["tmp_root"]), rel.split("/", 1)[1]
    return str(req["root"]), rel


def _where(rel: str, req: Json) -> str:
    """An entry's directory on this host."""
    return os.path.join(*_top(rel, req))


def _is_entry(rel: str, req: Json) -> bool:
    return _real_path(*_top(rel, req))


def cache_entries(req: Json) -> List[Json]:
    """Every seedable entry on the host: its path, files, bytes and the newest file's
    mtime (which start wrote it). Reached through real directories only."""
    root = str(req["root"])
    out: List[Json] = []
    names: List[str] = []
    for parent in ENTRY_PARENTS:
        if not _real_path(root, parent):
            continue
        try:
            names += [parent + "/" + n for n in sorted(os.listdir(os.path.join(root, parent)))
                      if _HASH.match(n)]
        except OSError:
            continue
    if req.get("tmp_root") and _real_path(str(req["tmp_root"])):
        names += list(TMP_ENTRIES)
    for rel in names:
        if not _is_entry(rel, req):
            continue
        if req.get("names"):  # facts: which entries there are, not their size
            out.append({"path": rel})
            continue
        files, size, newest = _tree_size(_where(rel, req))
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


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    for block in iter(lambda: os.read(fd, 1 << 20), b""):
        h.update(block)
    os.lseek(fd, 0, os.SEEK_SET)
    return h.hexdigest()


def _add_tree(tar: tarfile.TarFile, rel: str, src: str) -> int:
    """Pack ``src`` as ``rel``: directories and regular files, each file opened without
    following a link and described by its open descriptor (a file swapped for a link
    between the walk and the read is not packed)."""
    files = 0
    for base, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(base, d)))
        arc = os.path.normpath(os.path.join(rel, os.path.relpath(base, src)))
        info = tarfile.TarInfo(arc)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(os.lstat(base).st_mtime)
        tar.addfile(info)
        for name in sorted(names):
            try:
                fd = os.open(os.path.join(base, name), os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
            except OSError as exc:  # a link, or a file gone: vLLM and torch write plain
                if exc.errno in (errno.ELOOP, errno.ENOENT):  # files; one the user
                    continue  # cannot read fails the entry (it would seed half of it)
                raise
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                info = tarfile.TarInfo(os.path.join(arc, name))
                info.size, info.mtime = st.st_size, int(st.st_mtime)
                info.mode = st.st_mode & 0o755 | 0o600
                tar.addfile(info, fh)
                files += 1
    return files


def _pack_one(rel: str, req: Json, uid: int, gid: int) -> Json:
    """Pack one entry into a root-only file of SEED_DIR, read by a child of the service
    user's (a link planted anywhere in its cache reaches only what that user may read)."""
    tmp = os.path.join(SEED_DIR, ".pack-%s" % os.urandom(8).hex())
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o600)
    try:
        def work() -> Json:
            if not _is_entry(rel, req):
                return {"error": "%s is not a real directory of the cache" % rel}
            with os.fdopen(os.dup(fd), "wb") as out, \
                    tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
                files = _add_tree(tar, rel, _where(rel, req))
            return {"files": files}

        done = as_user(uid, gid, work)
        if "error" in done:
            _unlink(tmp)
            return {"entry": rel, "warning": "%s not packed: %s" % (rel, done["error"])}
        digest = _sha256_fd(fd)
        name = digest + ".tar.gz"
        os.replace(tmp, os.path.join(SEED_DIR, name))
        return {"entry": rel, "blob": name, "sha256": digest, "files": int(done["files"]),
                "bytes": os.fstat(fd).st_size}
    finally:
        os.close(fd)


def cache_pack(req: Json) -> Json:
    """Pack each named entry into its own tar.gz under SEED_DIR (a blob per entry: a host
    is sent only the entries it lacks, a harvest packs only what changed), as the service
    user; one it cannot pack is a warning, never another's bytes."""
    wanted = [str(e) for e in req["entries"]]
    _check_entries(wanted)
    uid, gid = _owner(str(req["user"]))
    os.makedirs(SEED_DIR, mode=0o700, exist_ok=True)
    blobs: List[Json] = []
    warnings: List[str] = []
    for rel in wanted:
        if not _is_entry(rel, req):
            continue
        one = _pack_one(rel, req, uid, gid)
        if "warning" in one:
            warnings.append(str(one["warning"]))
        else:
            blobs.append(one)
    out: Json = {"blobs": blobs}
    if warnings:
        out["warning"] = "; ".join(warnings)
    return out


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


def check_pack(fileobj: IO[bytes], entry: str, max_bytes: int = UNPACK_MAX_BYTES,
               max_files: int = UNPACK_MAX_FILES) -> Tuple[List[tarfile.TarInfo], int]:
    """The members of one entry's pack and the bytes they unpack to, read from the pack's
    own listing; ValueError says why it may not be unpacked: not a tar.gz, a member that
    is no plain file or directory of the entry, a name twice, more bytes or files than
    allowed. The controller checks a pack with it before keeping it, the host before
    unpacking it."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r:gz") as tar:
            members = []
            total = 0
            seen = set()
            for m in tar:
                why = _member_ok(m, entry)
                if why is not None:
                    raise ValueError(why)
                name = os.path.normpath(m.name)
                if name in seen:
                    raise ValueError("%r twice" % m.name)
                seen.add(name)
                total += m.size if m.isreg() else 0
                if total > max_bytes:
                    raise ValueError("more than %d bytes unpacked" % max_bytes)
                if len(seen) > max_files:
                    raise ValueError("more than %d files" % max_files)
                members.append(m)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ValueError("not a packed cache (%s)" % (exc,)) from None
    if entry not in seen:
        raise ValueError("no directory %s" % entry)
    return members, total


def _bound(part: Json, key: str, ceiling: int) -> int:
    """A part's claimed size (the manifest's, from its harvest) under the ceiling, plus
    room for the directories it lists."""
    value = part.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < ceiling:
        return value
    return ceiling


def _unpack(fd: int, rel: str, req: Json, part: Json) -> Json:
    """In the service user's child: make the entry's parent, check the pack's listing
    against its bounds and the free space, unpack it into a staging directory beside its
    place and rename it there. Nothing of root's is used but the open upload."""
    top, below = _top(rel, req)
    dest = os.path.join(top, below)
    parent = os.path.dirname(dest)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    if not _real_path(top, os.path.dirname(below)):
        return {"error": "%s is not a real directory of the service user's" % parent}
    if os.path.lexists(dest):
        return {"kept": True}
    with os.fdopen(os.dup(fd), "rb") as fh:
        members, total = check_pack(fh, rel, _bound(part, "bytes_raw", UNPACK_MAX_BYTES),
                                    _bound(part, "files", UNPACK_MAX_FILES - 1) * 2 + 64)
    vfs = os.statvfs(parent)
    free = vfs.f_bavail * vfs.f_frsize
    if total + FREE_MARGIN > free:
        return {"error": "%d bytes to unpack, %d free under %s" % (total, free, parent)}
    stage = os.path.join(parent, ".vigil-seed-%s" % os.urandom(8).hex())
    os.mkdir(stage, 0o700)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        with os.fdopen(os.dup(fd), "rb") as fh, tarfile.open(fileobj=fh, mode="r:gz") as tar:
            for m in members:
                out = os.path.join(stage, m.name)
                if m.isdir():
                    os.makedirs(out, mode=0o755, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(out), mode=0o755, exist_ok=True)
                data = tar.extractfile(m)
                assert data is not None
                wfd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW,
                              m.mode & 0o755 | 0o600)
                with os.fdopen(wfd, "wb") as w:
                    shutil.copyfileobj(data, w)
                    w.flush()
                    os.utime(wfd, (m.mtime, m.mtime))  # older than the start: warm
        if os.path.lexists(dest):
            return {"kept": True}
        os.rename(os.path.join(stage, rel), dest)
        return {"seeded": True}
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _seed_one(part: Json, req: Json, uid: int, gid: int) -> Tuple[str, str]:
    """("seeded" | "kept" | a warning, the entry)."""
    rel = str(part["entry"])
    if not _entry_ok(rel):
        return "not a cache entry: %r" % rel, rel
    upload = _blob_path(str(part["blob"]))
    try:
        fd = os.open(upload, os.O_RDONLY | O_NOFOLLOW)
    except FileNotFoundError:
        return "the upload %s is missing" % upload, rel
    try:
        digest = _sha256_fd(fd)
        if digest != part["sha256"]:
            return "%s: the upload's sha256 is %s, not %s" % (
                rel, digest[:16], str(part["sha256"])[:16]), rel
        top = _top(rel, req)[0]
        why = _own_top(top, uid, gid)
        if why is not None:
            return why, rel
        done = as_user(uid, gid, lambda: _unpack(fd, rel, req, part))
    finally:
        os.close(fd)
        _unlink(upload)
    if "error" in done:
        return "%s: %s" % (rel, done["error"]), rel
    return ("seeded" if done.get("seeded") else "kept"), rel


def _own_top(top: str, uid: int, gid: int) -> Optional[str]:
    """The directory an entry goes under (the cache root, /tmp/torchinductor_<user>): made
    by root for the service user when missing, as vLLM or torch would have made it; one
    that is a link, or that another user made first (in /tmp), is not used."""
    if not os.path.lexists(top):
        os.makedirs(os.path.dirname(top), mode=0o755, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(top, 0o755)
            os.lchown(top, uid, gid)
    st = os.lstat(top)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        return "%s is not a directory of the service user's" % top
    return None


def seed(action: Json, paths: Dict[str, str]) -> Json:
    """Seed a cache, entry by entry: check each upload's sha256 (as root, in root's
    SEED_DIR), then unpack it as the service user into a staging directory beside its
    place, bounded by its pack's listing and the free space, and rename it into place
    where the host lacks the entry. Any fault of one entry (a mismatch, not a tar.gz, a
    bad member, too big) seeds that entry not and says so; the start then compiles it as
    it would have (ok: a seed never fails a deploy)."""
    parts = [p for p in action["blobs"] if isinstance(p, dict)]
    uid, gid = _owner(str(action["user"]))
    seeded: List[str] = []
    kept: List[str] = []
    warnings: List[str] = []
    for part in parts:
        try:
            how, rel = _seed_one(part, action, uid, gid)
        except (OSError, ValueError, KeyError) as exc:
            how, rel = "%s: %s" % (part.get("entry"), exc), str(part.get("entry"))
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
    """Remove entries (a quarantined seed), so the next start compiles them anew: as the
    service user, through real directories only."""
    rels = [str(e) for e in req["entries"]]
    _check_entries(rels)
    uid, gid = _owner(str(req["user"]))

    def work() -> Json:
        dropped: List[str] = []
        for rel in rels:
            if _is_entry(rel, req):
                shutil.rmtree(_where(rel, req))
                dropped.append(rel)
        return {"dropped": dropped}

    out = as_user(uid, gid, work)
    if "error" in out:
        raise OSError(out["error"])
    return out
