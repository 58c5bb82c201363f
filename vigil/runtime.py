"""Runtime role: is the stack's environment installed as pinned, and how to install it."""

from __future__ import annotations

from typing import Any

from vigil.config import Stack
from vigil.facts import HostFacts

MIN_FREE_FOR_INSTALL = 10 * 2**30


def runtime_differences(stack: Stack, facts: HostFacts) -> list[str]:
    if not facts.env_complete or facts.packages is None:
        return ["environment not installed" + (f" ({facts.env_error})" if facts.env_error else "")]
    diffs = []
    for name, version in stack.packages.items():
        have = facts.packages.get(name.lower().replace("_", "-"))
        if have != version:
            diffs.append(f"{name} {have or 'missing'} != {version}")
    for name in stack.remove:
        if name.lower() in facts.packages:
            diffs.append(f"{name} {facts.packages[name.lower()]} installed, must be removed")
    return diffs


def install_payload(stack: Stack, env_dir: str) -> dict[str, Any]:
    """What the host agent needs to build `env_dir` from `stack`."""
    return {
        "env_dir": env_dir,
        "python": stack.python,
        "requirements": [f"{n}=={v}" for n, v in stack.packages.items()],
        "remove": stack.remove,
        "find_links": stack.find_links,
        "index_url": stack.index_url,
        "extra_index_urls": stack.extra_index_urls,
        "import_check": "import vllm",
    }
