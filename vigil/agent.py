"""The host side of deploy: stdlib-only, run as ``python3 -c SOURCE VERB`` over SSH.

It reads one JSON request on stdin and prints one JSON reply on stdout. Secrets travel
on stdin only, never on a command line (which any user could read in /proc). One call
is one SSH round trip: ``facts`` reads everything a plan needs, ``apply`` runs a whole
plan, ``serving`` is one poll of a starting service, ``rollback`` restores the last
release. Python 3.8+ on purpose: it runs on the host's own python3.
"""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

Json = Dict[str, Any]

PY_LIST = (
    "import json,importlib.metadata as m;"
    "print(json.dumps({d.metadata['Name'].lower().replace('_','-'):d.version"
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
    return {"kind": "path", "exists": True, "config": config}


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
    packages, env_error = installed_packages(paths["env_dir"])
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
    return {
        "uid": os.getuid(),
        "files": files,
        "writable": {
            name: writable(os.path.dirname(paths[key]))
            for name, key in (("unit", "unit"), ("env", "env"), ("envs", "env_dir"),
                              ("state", "backup_dir"))
        },
        "current": os.readlink(current) if os.path.islink(current) else None,
        "env_complete": os.path.exists(os.path.join(paths["env_dir"], ".vigil-complete")),
        "packages": packages,
        "env_error": env_error,
        "service": service,
        "health": health,
        "service_user_exists": user_ok,
        "model": model_facts(req["model"]),
        "disk_free_bytes": usage.free,
        "backup": os.path.isdir(paths["backup_dir"]),
    }


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
    """Build the stack's environment in its own directory; never touch `current`."""
    env_dir = action["env_dir"]
    log = env_dir + ".install.log"
    if os.path.exists(env_dir) and not os.path.exists(os.path.join(env_dir, ".vigil-complete")):
        shutil.rmtree(env_dir)  # a half-built environment from an interrupted install
    os.makedirs(os.path.dirname(env_dir), exist_ok=True)
    with open(log, "w") as fh:
        fh.write("vigil install %s\n" % time.strftime("%Y-%m-%dT%H:%M:%S"))
    steps = [[action["python"], "-m", "venv", env_dir]]
    pip = [os.path.join(env_dir, "bin", "python"), "-m", "pip", "--disable-pip-version-check"]
    install = pip + ["install", "--no-input"]
    for link in action.get("find_links", []):
        install += ["--find-links", link]
    if action.get("index_url"):
        install += ["--index-url", action["index_url"]]
    for url in action.get("extra_index_urls", []):
        install += ["--extra-index-url", url]
    steps.append(install + action["requirements"])
    for cmd in steps:
        code, _ = run(cmd, log=log)
        if code != 0:
            shutil.rmtree(env_dir, ignore_errors=True)
            return {"ok": False, "error": "exit %d: %s" % (code, " ".join(cmd[:6])),
                    "log": log, "tail": tail(log)}
    if action.get("remove"):
        code, _ = run(pip + ["uninstall", "-y"] + action["remove"], log=log)
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
    code, out = run([os.path.join(env_dir, "bin", "python"), "-c", action["import_check"]],
                    timeout=600)
    if wrong or err or code != 0:
        shutil.rmtree(env_dir, ignore_errors=True)
        detail = "; ".join(wrong) or err or out[-1500:]
        return {"ok": False, "error": "environment check failed: %s" % detail, "log": log}
    write_atomic(os.path.join(env_dir, ".vigil-complete"), json.dumps(packages), 0o644)
    return {"ok": True, "log": log}


def apply(req: Json) -> Json:
    paths = req["paths"]
    results: List[Json] = []
    for action in req["actions"]:
        kind = action["kind"]
        try:
            if kind == "install_env":
                res = install_env(action)
            elif kind == "backup":
                backup_release(paths)
                res = {"ok": True}
            elif kind == "switch_env":
                switch_link(paths["current"], paths["env_dir"])
                res = {"ok": True}
            elif kind in ("write_unit", "write_env"):
                key = "unit" if kind == "write_unit" else "env"
                write_atomic(paths[key], action["content"], int(action["mode"], 8))
                res = {"ok": True}
            elif kind == "restart":
                # clears a start-limit hit left by an earlier crash loop, then restarts
                run(["systemctl", "reset-failed", action["unit"]], timeout=60)
                code, out = run(["systemctl", "restart", action["unit"]], timeout=300)
                res = {"ok": code == 0, "error": out if code else None}
            elif kind == "systemctl":
                code, out = run(["systemctl"] + action["args"], timeout=300)
                res = {"ok": code == 0, "error": out if code else None}
            else:
                res = {"ok": False, "error": "unknown action %s" % kind}
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


def journal_tail(unit: str, lines: int) -> str:
    _, out = run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"])
    return out


def serving(req: Json) -> Json:
    service = systemctl_show(req["unit"])
    reply: Json = {"service": service, "health": None, "completion": None}
    if service.get("ActiveState") in ("failed", "inactive") or req.get("journal"):
        reply["journal"] = journal_tail(req["unit"], 40)
    if service.get("ActiveState") != "active":
        return reply
    headers: Dict[str, str] = {}
    if req.get("api_key"):
        headers["Authorization"] = "Bearer " + req["api_key"]
    reply["health"] = http(req["port"], "/health", timeout=3.0)
    if reply["health"].get("status") == 200 and req.get("completion"):
        reply["completion"] = http(req["port"], "/v1/completions", req["completion"],
                                   headers=headers, timeout=req.get("completion_timeout", 120))
    return reply


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
         "serving": serving}

if __name__ == "__main__":
    request = json.loads(sys.stdin.read() or "{}")
    reply = VERBS[sys.argv[1]](request)
    sys.stdout.write(json.dumps(reply))
