"""The host side of deploy: stdlib-only, run as ``python3 -c SOURCE VERB`` over SSH.

It reads one JSON request on stdin and prints one JSON reply on stdout. Secrets travel
on stdin only, never on a command line (which any user could read in /proc). One call
is one SSH round trip: ``facts`` reads everything a plan needs, ``apply`` runs a whole
plan (one applier per action kind, ``APPLIERS``), ``rollback`` restores the last release.
Python 3.8+ on purpose: it runs on the host's own python3.
"""

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
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


def read_text(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except PermissionError:
        return {"error": "permission denied"}


def systemctl_show(unit: str) -> Dict[str, str]:
    props = "LoadState,ActiveState,SubState,MainPID,NRestarts,UnitFileState,ExecMainStatus"
    proc = subprocess.run(
        ["systemctl", "show", unit, "-p", props], capture_output=True, text=True
    )
    out: Dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    if proc.returncode != 0:
        out["error"] = proc.stderr.strip()
    return out


def http(
    port: int, path: str, body: Optional[Json] = None,
    headers: Optional[Dict[str, str]] = None, timeout: float = 3.0,
) -> Json:
    url = "http://127.0.0.1:%d%s" % (port, path)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
            return {"status": resp.status, "body": text[:4000],
                    "seconds": time.monotonic() - started}
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        return {"status": exc.code, "body": text[:4000], "seconds": time.monotonic() - started}
    except Exception as exc:  # refused, timeout, reset: all mean "not serving"
        return {"status": None, "error": "%s: %s" % (type(exc).__name__, exc)}


def installed_packages(env_dir: str) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    python = os.path.join(env_dir, "bin", "python")
    if not os.path.exists(python):
        return None, None
    proc = subprocess.run([python, "-c", PY_LIST], capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr.strip()[-2000:]
    return json.loads(proc.stdout), None


def model_facts(path: str) -> Json:
    if not path.startswith("/"):
        return {"kind": "hub-id"}
    if not os.path.isdir(path):
        return {"kind": "path", "exists": False}
    config = None
    raw = read_text(os.path.join(path, "config.json"))
    if isinstance(raw, str):
        try:
            full = json.loads(raw)
            text_cfg = full.get("text_config", full)
            config = {
                k: text_cfg.get(k)
                for k in ("max_position_embeddings", "num_attention_heads", "architectures")
            }
        except ValueError:
            config = {"error": "config.json is not valid JSON"}
    return {"kind": "path", "exists": True, "config": config, "weights": weight_files(path),
            "layouts": weight_layouts(path)}


def weight_files(path: str) -> Json:
    """Shards the safetensors index lists and which of them are absent."""
    names = os.listdir(path)
    present = sorted(n for n in names if n.endswith((".safetensors", ".bin", ".pt")))
    index = read_text(os.path.join(path, "model.safetensors.index.json"))
    if not isinstance(index, str):
        return {"index": False, "present": len(present), "missing": []}
    try:
        listed = sorted(set(json.loads(index).get("weight_map", {}).values()))
    except (ValueError, AttributeError):
        return {"index": True, "error": "model.safetensors.index.json is not valid JSON",
                "present": len(present), "missing": []}
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
        out["size"] = size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                out["error"] = "shorter than the 8-byte header length"
                return out
            out["header_len"] = n = int.from_bytes(head, "little")
            if n > SAFETENSORS_HEADER_MAX or 8 + n > size:
                return out  # the controller names the sizes; nothing to parse
            header = json.loads(fh.read(n).decode("utf-8"))
    except PermissionError:
        out["error"] = "permission denied"
        return out
    except OSError as exc:
        out["error"] = "cannot read: %s" % exc.strerror
        return out
    except ValueError:
        out["error"] = "its header is not valid JSON"
        return out
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        out["error"] = "its header has a tensor without data_offsets"
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
        size = os.path.getsize(path)
        if size == 0:
            return "empty"
        if not path.endswith(".json"):
            return "ok"  # binary or plain text (tokenizer.model, merges.txt): present
        with open(path, "rb") as fh:
            if size <= JSON_PARSE_MAX:
                json.loads(fh.read().decode("utf-8"))
                return "ok"
            first = fh.read(64).lstrip()[:1]
            fh.seek(-64, os.SEEK_END)
            last = fh.read().rstrip()[-1:]
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return "unreadable: %s" % exc.strerror
    except ValueError as exc:
        return "invalid: %s" % str(exc)[:200]
    if (first, last) not in ((b"{", b"}"), (b"[", b"]")):
        return "invalid: does not end where its JSON started (cut short?)"
    return "ok"


def weight_layouts(path: str) -> Json:
    """Every top-level safetensors file's layout and the state of the files vLLM reads
    before the weights (config, tokenizer): a few KB per file, never the tensors."""
    expected: Dict[str, Set[str]] = {}
    raw = read_text(os.path.join(path, "model.safetensors.index.json"))
    if isinstance(raw, str):
        with contextlib.suppress(ValueError, AttributeError):
            for name, shard in json.loads(raw).get("weight_map", {}).items():
                expected.setdefault(str(shard), set()).add(str(name))
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    return {
        "safetensors": {n: safetensors_layout(os.path.join(path, n), expected.get(n))
                        for n in files},
        "meta": {n: json_file_state(os.path.join(path, n)) for n in MODEL_META_FILES},
    }


def env_in_use(paths: Dict[str, str]) -> str:
    """The stack's environment the `current` link points to (a reinstall lives beside the
    first build as ENV_DIR-rN), or the stack's first directory when it points elsewhere."""
    base = paths["env_dir"]
    current = paths["current"]
    if os.path.islink(current):
        target = os.readlink(current)
        if target == base or re.match(re.escape(base) + r"-r\d+$", target):
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


def service_pids(unit: str, main_pid: int) -> List[int]:
    """Every process of the service: its cgroup (workers included) and the MainPID tree."""
    pids: Set[int] = set()
    for base in ("/sys/fs/cgroup/system.slice", "/sys/fs/cgroup/systemd/system.slice"):
        text = read_text(os.path.join(base, unit + ".service", "cgroup.procs"))
        if isinstance(text, str):
            pids.update(int(p) for p in text.split() if p.isdigit())
    if main_pid:
        children: Dict[int, List[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            stat = read_text("/proc/%s/stat" % name)
            if isinstance(stat, str):
                fields = stat.rsplit(")", 1)[-1].split()
                if len(fields) > 1:
                    children.setdefault(int(fields[1]), []).append(int(name))
        todo = [main_pid]
        seen = set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            pids.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(pids)


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


NVML_SCRIPT = r"""
import json
try:
    import pynvml as n
except Exception as exc:
    print(json.dumps({"error": "import pynvml: %s" % exc})); raise SystemExit(0)
try:
    n.nvmlInit()
except Exception as exc:
    print(json.dumps({"error": "nvmlInit: %s" % exc})); raise SystemExit(0)
def text(v):
    return v.decode() if isinstance(v, bytes) else v
out = {"driver": text(n.nvmlSystemGetDriverVersion()), "gpus": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    procs = n.nvmlDeviceGetComputeRunningProcesses(h)
    out["gpus"].append({"index": i, "name": text(n.nvmlDeviceGetName(h)),
                        "uuid": text(n.nvmlDeviceGetUUID(h)),
                        "memory_total": mem.total, "memory_used": mem.used,
                        "processes": [{"pid": p.pid, "used_memory": p.usedGpuMemory}
                                      for p in procs]})
print(json.dumps(out))
"""
SMI_GPUS = ["--query-gpu=index,name,uuid,memory.total,memory.used",
            "--format=csv,noheader,nounits"]
SMI_APPS = ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
            "--format=csv,noheader,nounits"]


def gpu_facts(python: str) -> Json:
    """Raw GPU readings: NVML through the environment's python (nvidia-ml-py lives there),
    else nvidia-smi's CSV; parsed on the controller (vigil/gpus.py)."""
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
    pids: List[int] = []
    if out["nvml"] is not None:
        pids = [p["pid"] for g in out["nvml"]["gpus"] for p in g["processes"]]
    else:
        smi = shutil.which("nvidia-smi")
        if smi:
            for key, args in (("smi_gpus", SMI_GPUS), ("smi_apps", SMI_APPS)):
                code, text = run([smi] + args, timeout=60)
                out[key] = text if code == 0 else None
                if code != 0:
                    out["smi_error"] = text[-300:]
            # only to look up command lines; vigil/gpus.py does the real parsing
            for line in (out["smi_apps"] or "").splitlines():
                fields = [f.strip() for f in line.split(",")]
                if len(fields) > 1 and fields[1].isdigit():
                    pids.append(int(fields[1]))
    out["cmdlines"] = dict((str(p), cmdline(p)) for p in pids)
    return out


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


def facts(req: Json) -> Json:
    paths = req["paths"]
    files = {name: read_text(paths[name]) for name in RELEASE_FILES}
    current = paths["current"]
    env_dir = env_in_use(paths)
    packages, env_error = installed_packages(env_dir)
    service = systemctl_show(req["unit"])
    health = None
    if service.get("ActiveState") == "active":
        health = http(req["port"], "/health", timeout=2.0)
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
        "service_pids": service_pids(req["unit"], main_pid),
        "health": health,
        "service_user_exists": user_ok,
        "model": model_facts(req["model"]),
        "disk_free_bytes": usage.free,
        "backup": os.path.isdir(paths["backup_dir"]),
        "port": port_owners(int(req["port"])),
        "uv": find_uv(),
        "gpus": gpu_facts(os.path.join(env_dir, "bin", "python")),
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
    reply: Json = {"current": target, "packages": listed, "env_error": err,
                   "complete": os.path.exists(os.path.join(target, ".vigil-complete"))}
    if req.get("pip_check") and listed is not None:
        reply["pip_check"] = run([os.path.join(target, "bin", "python"), "-m", "pip",
                                  "--disable-pip-version-check", "check"], timeout=300)[1]
    return reply


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def write_atomic(path: str, content: str, mode: int) -> None:
    """Temp file in the same directory, fsync, rename: a reader sees old or new, never half."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vigil-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def switch_link(link: str, target: str) -> None:
    tmp = "%s.vigil-%d" % (link, os.getpid())
    os.symlink(target, tmp)
    os.replace(tmp, link)  # rename(2) over the old link: atomic


def backup_release(paths: Dict[str, str]) -> None:
    """Keep the release being replaced (unit, env, environment link) as one set."""
    bdir = paths["backup_dir"]
    tmp = bdir + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o700)
    for name in RELEASE_FILES:
        if os.path.exists(paths[name]):
            shutil.copy2(paths[name], os.path.join(tmp, name))
    if os.path.islink(paths["current"]):
        write_atomic(os.path.join(tmp, "current"), os.readlink(paths["current"]), 0o600)
    old = bdir + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(bdir):
        os.replace(bdir, old)
    os.replace(tmp, bdir)
    shutil.rmtree(old, ignore_errors=True)


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
    with open(log, "w") as fh:
        fh.write("vigil install %s with %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                uv or "pip"))
    sources: List[str] = []
    for link in action.get("find_links", []):
        sources += ["--find-links", link]
    if action.get("index_url"):
        sources += ["--index-url", action["index_url"]]
    for url in action.get("extra_index_urls", []):
        sources += ["--extra-index-url", url]
    env = dict(os.environ)
    cache = action.get("cache_dir")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    if uv:
        # /root may be read-only (lab hosts): keep uv's cache in vigil's cache directory
        env["UV_CACHE_DIR"] = cache or env.get("UV_CACHE_DIR") or "/var/cache/vigil/uv"
        env["UV_PYTHON_DOWNLOADS"] = "never"
        # trust the host's CA store as pip does (a site proxy's CA lives there)
        env.setdefault("UV_SYSTEM_CERTS", "1")
        env.setdefault("UV_NATIVE_TLS", "1")
        steps = [
            [uv, "venv", "--seed", "--python", action["python"], env_dir],
            [uv, "pip", "install", "--python", python, "-c", constraints,
             # pins are exact: any index may supply them (uv's default takes the first)
             "--index-strategy", "unsafe-best-match"] + sources + action["requirements"],
        ]
        uninstall = [uv, "pip", "uninstall", "--python", python]
    else:
        if cache:
            env["PIP_CACHE_DIR"] = cache
        steps = [
            [action["python"], "-m", "venv", env_dir],
            pip + ["install", "--no-input", "-c", constraints] + sources
            + action["requirements"],
        ]
        uninstall = pip + ["uninstall", "-y"]
    for cmd in steps:
        code = run_logged(cmd, log, env)
        if code != 0:
            shutil.rmtree(env_dir, ignore_errors=True)
            return {"ok": False, "error": "exit %d: %s" % (code, " ".join(cmd[:7])),
                    "log": log, "tail": tail(log), "installer": "uv" if uv else "pip"}
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
    code, out = run(pip + ["check"], timeout=300)
    pip_check = out
    code, out = run([python, "-c", action["import_check"]], timeout=600)
    reply = {"ok": True, "log": log, "env_dir": env_dir, "packages": packages,
             "pip_check": pip_check, "installer": "uv" if uv else "pip",
             "install_seconds": round(installed_s, 1),
             "seconds": round(time.monotonic() - started, 1)}
    if wrong or err or code != 0:
        shutil.rmtree(env_dir, ignore_errors=True)
        detail = "; ".join(wrong) or err or ("%s failed: %s" % (action["import_check"],
                                                               out[-1500:]))
        reply.update(ok=False, error="environment check failed: %s" % detail)
    return reply


def run_logged(cmd: List[str], log: str, env: Dict[str, str]) -> int:
    with open(log, "a") as fh:
        fh.write("$ %s\n" % " ".join(cmd))
        fh.flush()
        return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode


def remove_envs(action: Json, paths: Dict[str, str]) -> Json:
    """Collect old environments; never the one `current` or the kept release points to."""
    keep = set()
    if os.path.islink(paths["current"]):
        keep.add(os.readlink(paths["current"]))
    backup = read_text(os.path.join(paths["backup_dir"], "current"))
    if isinstance(backup, str):
        keep.add(backup)
    removed = []
    for path in action["paths"]:
        if path in keep or not path.startswith(os.path.dirname(paths["env_dir"]) + "/"):
            continue
        shutil.rmtree(path, ignore_errors=True)
        for extra in (".install.log", ".constraints.txt"):
            if os.path.exists(path + extra):
                os.unlink(path + extra)
        removed.append(path)
    return {"ok": True, "removed": removed}


def kill_pids(action: Json) -> Json:
    """End the stale GPU holders named by the controller: TERM, then KILL after 10 s."""
    pids = [int(p) for p in action["pids"]]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if os.path.exists("/proc/%d" % p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return {"ok": True, "killed": pids, "forced": alive}


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


def _backup(action: Json, paths: Dict[str, str]) -> Json:
    backup_release(paths)
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
}


def apply(req: Json) -> Json:
    paths = req["paths"]
    results: List[Json] = []
    for action in req["actions"]:
        kind = action["kind"]
        applier = APPLIERS.get(kind)
        try:
            res = applier(action, paths) if applier else {
                "ok": False, "error": "unknown action %s" % kind}
        except PermissionError as exc:
            res = {"ok": False, "error": "permission denied: %s" % exc.filename,
                   "permission": True}
        except OSError as exc:
            res = {"ok": False, "error": "%s: %s" % (exc.strerror, exc.filename)}
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
    backup_release(paths)
    for name in RELEASE_FILES:
        if isinstance(restore[name], str):
            write_atomic(paths[name], restore[name], 0o600 if name == "env" else 0o644)
    if isinstance(link, str) and os.path.isdir(link):
        switch_link(paths["current"], link)
    for args in (["daemon-reload"], ["reset-failed", req["unit"]], ["restart", req["unit"]]):
        code, out = run(["systemctl"] + args, timeout=300)
        if code != 0 and args[0] != "reset-failed":
            return {"ok": False, "error": "systemctl %s: %s" % (" ".join(args), out)}
    return {"ok": True, "restored": [n for n in RELEASE_FILES if restore[n]],
            "env": link if isinstance(link, str) else None}


def status(req: Json) -> Json:
    props = ("ActiveState,SubState,MainPID,NRestarts,ActiveEnterTimestamp,"
             "ActiveEnterTimestampMonotonic,LoadState")
    proc = subprocess.run(["systemctl", "show", req["unit"], "-p", props],
                          capture_output=True, text=True)
    service = dict(line.partition("=")[::2] for line in proc.stdout.splitlines())
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    since = int(service.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
    unit = read_text(req["unit_path"])
    exec_start = ""
    if isinstance(unit, str):
        exec_start = next((line[10:] for line in unit.splitlines()
                           if line.startswith("ExecStart=")), "")
    health = None
    if service.get("ActiveState") == "active":
        health = http(req["port"], "/health", timeout=2.0).get("status")
    return {"service": service, "uptime_s": uptime - since if since else None,
            "exec_start": exec_start, "health": health}


VERBS: Dict[str, Any] = {"status": status, "facts": facts, "apply": apply, "rollback": rollback,
                         "packages": packages}

if __name__ == "__main__":
    request = json.loads(sys.stdin.read() or "{}")
    reply = VERBS[sys.argv[1]](request)
    sys.stdout.write(json.dumps(reply))
