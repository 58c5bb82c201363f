"""Runtime role (pure): is the stack's environment installed as pinned and as its rules
say, where a (re)install goes, what verifies it, and which old environments to collect.

Environments live in ``{env_root}/{stack}-{hash}`` (first build) and ``...-rN`` (every
rebuild beside a live one): a running service keeps its environment until the restart,
and a build that fails verification never becomes ``current``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vigil.deploy.facts import HostFacts
from vigil.deploy.gpucheck import installed_arch_problems
from vigil.desired.stacks import Finding, Stack, check, pip_check_problems
from vigil.verify.catalog import classify, is_specific

# How many old environments to keep (keep_envs), the installer and the free disk an
# install needs are the runtime role's defaults (roles/runtime/defaults.yml).


def pip_for(env_dir: str, packages: Mapping[str, str] | None = None,
            uv: str | None = None) -> str:
    """The installer command a fix names for this environment: its own pip, or the host's
    uv for an environment uv built (which has no pip)."""
    if uv and packages is not None and "pip" not in packages:
        return f"VIRTUAL_ENV={env_dir} {uv} pip"
    return f"{env_dir}/bin/python -m pip"


def findings(stack: Stack, facts: HostFacts, env_dir: str) -> list[Finding]:
    if facts.packages is None:
        return []
    return check(stack, facts.packages,
                 pip_for(facts.env_dir or env_dir, facts.packages, facts.uv))


def runtime_differences(stack: Stack, facts: HostFacts) -> list[str]:
    if not facts.env_complete or facts.packages is None:
        return ["environment not installed" + (f" ({facts.env_error})" if facts.env_error else "")]
    diffs = []
    for f in check(stack, facts.packages):
        if f.rule == "pin":
            diffs.append(f"{f.package} {f.version or 'missing'} != {stack.packages[f.package]}")
        elif f.rule == "remove":
            diffs.append(f"{f.package} {f.version} installed, must be removed")
        elif f.rule == "lock":
            diffs.append(f"{f.package} {f.version or 'missing'} != lock ({f.expected})")
        else:
            diffs.append(f"{f.package} {f.version or 'missing'} breaks {f.rule}")
    return diffs


def _family(base: str, path: str) -> int | None:
    """0 for the first build, N for ``base-rN``, None for another stack's directory."""
    if path == base:
        return 0
    m = re.fullmatch(re.escape(base) + r"-r(\d+)", path)
    return int(m.group(1)) if m else None


def install_dir(base: str, facts: HostFacts) -> str:
    """Where an install goes: the first directory while none of this stack exists, else a
    fresh ``base-rN`` beside them (never over the environment a service may run)."""
    taken = [n for n in (_family(base, p) for p, _, _ in facts.envs) if n is not None]
    if facts.current_env is not None and _family(base, facts.current_env) is not None:
        taken.append(_family(base, facts.current_env) or 0)
    if not taken:
        return base
    return f"{base}-r{max(taken) + 1}"


def in_use(base: str, facts: HostFacts) -> str:
    """The stack's environment the host runs now (or would, once switched)."""
    if facts.env_dir and _family(base, facts.env_dir) is not None:
        return facts.env_dir
    return base


def collect(facts: HostFacts, keep_also: set[str], keep: int, *,
            backup_replaced: bool = False) -> list[str]:
    """Old environments to delete: all but the ``keep`` newest, never one that ``current``
    or the kept release points to, nor ``keep_also`` (the one being switched to). When the
    plan replaces the kept release, its old environment is no longer special (the agent
    re-checks the links when it deletes)."""
    backup = None if backup_replaced else facts.backup_env
    protected = {p for p in (facts.current_env, backup, *keep_also) if p}
    others = sorted((e for e in facts.envs if e[0] not in protected),
                    key=lambda e: e[1], reverse=True)
    return [path for path, _, _ in others[keep:]]


def install_payload(
    stack: Stack, env_dir: str, current: str | None = None, installer: str = "auto"
) -> dict[str, Any]:
    """What the host agent needs to build `env_dir` from `stack`."""
    return {
        "env_dir": env_dir,
        "current": current,
        "python": stack.python,
        "requirements": [f"{n}=={v}" for n, v in stack.packages.items()],
        "remove": stack.remove,
        "find_links": stack.find_links,
        "index_url": stack.index_url,
        "extra_index_urls": stack.extra_index_urls,
        "imports": list(stack.verify_imports),
        "installer": installer,
        # with a lock: exactly its packages, hashes required (the pins are in it)
        **({"lock": stack.lock} if stack.lock is not None else {}),
    }


def failed_imports(reply: dict[str, Any]) -> dict[str, str]:
    """module -> the exception line its import ended with (the agent's install reply)."""
    imports = reply.get("imports")
    if not isinstance(imports, dict):
        return {}
    return {str(m): str(e) for m, e in imports.items() if e is not None}


def import_remedy(reply: dict[str, Any]) -> str | None:
    """The log catalog's remedy for a failed import whose line it knows (flashinfer's
    own pair check, for one): the same cause and fix a crashed start would get."""
    for line in failed_imports(reply).values():
        match = classify(line)
        if match.cause is not None and is_specific(match.cause):
            return match.remedy
    return None


API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def unknown_flags(argv: Sequence[str], parsed: Mapping[str, Any] | None) -> list[str]:
    """The options of ExecStart the environment's vLLM would reject: every ``--flag`` word
    after the API server module that its own parser lacks. Nothing to judge without the
    parser's list, or for a command line that does not run that module (a node group's
    `vllm serve` launcher adds the serve subcommand's own options)."""
    flags = (parsed or {}).get("flags")
    if not isinstance(flags, list) or API_SERVER_MODULE not in argv:
        return []
    known = set(flags)
    words = list(argv)[list(argv).index(API_SERVER_MODULE) + 1:]
    unknown = [w.split("=", 1)[0] for w in words if w.startswith("--")]
    return list(dict.fromkeys(f for f in unknown if f not in known))


def flag_problem(argv: Sequence[str], parsed: Mapping[str, Any] | None,
                 where: str) -> str | None:
    bad = unknown_flags(argv, parsed)
    if not bad:
        return None
    version = (parsed or {}).get("version") or "?"
    return (f"vLLM {version} in {where} rejects {', '.join(bad)}: its own argument parser "
            "has no such option")


def verify_install(stack: Stack, reply: dict[str, Any],
                   argv: Sequence[str] = ()) -> list[str]:
    """Everything wrong with a freshly built environment (the agent's install reply):
    pins, removals, rules, ``pip check``, each of the stack's ``verify_imports``.
    Empty: it may become current."""
    problems: list[str] = []
    if not reply.get("ok"):
        problems.append(str(reply.get("error") or "install failed"))
    for module, line in failed_imports(reply).items():
        problem = f"import {module}: {line}"
        if not any(problem in p for p in problems):
            problems.append(problem)
    packages = reply.get("packages")
    env_dir = str(reply.get("env_dir") or "ENV")
    if isinstance(packages, dict):
        problems += [f.describe() for f in check(
            stack, packages, pip_for(env_dir, packages, reply.get("uv")))]
    problems += [f"pip check: {line}" for line in
                 pip_check_problems(str(reply.get("pip_check") or ""), stack)]
    problems += installed_arch_problems(stack, reply)
    flag = flag_problem(argv, reply.get("vllm_flags"), env_dir)
    if flag:
        problems.append(flag)
    # the agent's own pin check repeats ours; say each problem once
    return list(dict.fromkeys(problems))
