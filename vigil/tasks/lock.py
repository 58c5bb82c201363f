"""`stack.lock`: resolve a stack to ``stacks/<name>.lock``, every package exact and hashed.

The resolution runs here, with uv (``uv pip compile --generate-hashes``) for the hosts'
Python and platform, from the stack's own index and find-links; the lock is then what
every host installs (vigil.desired.lock). An existing lock's versions are kept unless
``--upgrade``: re-locking after a pin change moves only what the change needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.context import Context

from vigil.errors import ConfigError, VigilError
from vigil.report import echo, safe_text
from vigil.tasks.common import load_inventory, user_errors, vigil_task

if TYPE_CHECKING:  # a task's libraries load when it runs, not at `vigil --help`
    from vigil.desired import lock as lockfile


RESOLVE_TIMEOUT_S = 900


def find_uv() -> str:
    """uv on PATH, else the one the `uv` package brings."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found,unused-ignore]

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        raise ConfigError("stack.lock resolves with uv, and there is none on this machine",
                          fix="install it: pip install uv (or put uv on PATH)") from None


def header(name: str, python_version: str, platform: str) -> str:
    return (f"# stacks/{name}.lock: every package of the stack {name}, exact and hashed.\n"
            f"# Written by `invoke stack.lock --stack {name} --python-version "
            f"{python_version} --platform {platform}`; do not edit.\n")


@vigil_task(help={
    "stack": "the stack to lock (a file of inventory/stacks)",
    "python_version": "the hosts' Python, e.g. 3.12 (that of the stack's `python`)",
    "platform": "the hosts' platform as uv names it (x86_64-manylinux_2_28, "
                "aarch64-manylinux_2_28, ...)",
    "upgrade": "resolve afresh instead of keeping the existing lock's versions",
})
def lock(c: Context, stack: str, python_version: str = "3.12",
         platform: str = "x86_64-manylinux_2_28", upgrade: bool = False) -> None:
    """Resolve a stack's pins to stacks/<name>.lock: every package exact and hashed."""
    from vigil.desired import lock as lockfile

    with user_errors():
        inv = load_inventory(c)
        st = inv.stack(stack, with_lock=False)
        path = inv.root / "stacks" / f"{stack}.lock"
        uv = find_uv()
        env = dict(os.environ)
        # an index URL may carry user:token@: it goes to uv in its environment, never on
        # its command line, and never into the lock (--no-emit-index-url)
        if st.index_url:
            env["UV_INDEX_URL"] = st.index_url
        if st.extra_index_urls:
            env["UV_EXTRA_INDEX_URL"] = " ".join(st.extra_index_urls)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "lock.txt"
            if path.is_file() and not upgrade:
                shutil.copyfile(path, out)  # uv keeps the versions an output file has
            cmd = [uv, "pip", "compile", "-", "--output-file", str(out), "--generate-hashes",
                   "--python-version", python_version, "--python-platform", platform,
                   "--index-strategy", "unsafe-best-match", "--no-header",
                   "--no-emit-index-url", "--no-emit-find-links", "--quiet"]
            for link in st.find_links:
                cmd += ["--find-links", link]
            pins = "".join(f"{n}=={v}\n" for n, v in st.packages.items())
            try:
                done = subprocess.run(cmd, input=pins, capture_output=True, text=True,
                                      env=env, timeout=RESOLVE_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise VigilError(f"stack {stack}: uv did not resolve it in "
                                 f"{RESOLVE_TIMEOUT_S} s", fix="check the stack's index "
                                 "and find_links are reachable from here") from None
            if done.returncode != 0:
                tail = "\n    ".join(safe_text(done.stderr).strip().splitlines()[-12:])
                raise VigilError(f"stack {stack}: uv cannot resolve its pins for Python "
                                 f"{python_version} on {platform}:\n    {tail}",
                                 fix=f"fix the pins in inventory/stacks/{stack}.yml, or the "
                                 "index/find_links they come from")
            text = header(stack, python_version, platform) + out.read_text()
        parsed = lockfile.parse(text, str(path))  # what uv wrote is a lock we can read
        old = path.read_text() if path.is_file() else None
        if old == text:
            echo(f"{path}: unchanged ({len(parsed.pins)} packages)")
            return
        tmp_path = path.with_name(f".{path.name}.tmp")
        tmp_path.write_text(text)
        os.replace(tmp_path, path)
        changed = _changes(old, parsed, str(path))
        echo(f"{path}: {len(parsed.pins)} packages, hash {parsed.digest}"
             + (f"; {changed}" if changed else ""))
        echo("the next deploy of this stack builds a new environment from it")


def _changes(old: str | None, new: lockfile.Lock, file: str) -> str:
    from vigil.desired import lock as lockfile

    if old is None:
        return "new"
    try:
        before = lockfile.parse(old, file).pins
    except ConfigError:
        return "replaces an unreadable lock"
    moved = [f"{n} {before[n]} -> {v}" for n, v in sorted(new.pins.items())
             if n in before and before[n] != v]
    added = sorted(set(new.pins) - set(before))
    gone = sorted(set(before) - set(new.pins))
    parts = moved + [f"+{n}" for n in added] + [f"-{n}" for n in gone]
    return ", ".join(parts) if parts else "same versions"
