"""A stack's lock (pure): every package of its environment, exact and hashed.

A stack pins its top-level packages; what they pull in (transformers, triton, nvidia-*,
tokenizers) would float from one install to the next, so "the same stack" could be other
bytes on two hosts. ``stacks/<name>.lock`` (requirements format with ``--hash`` lines, as
``uv pip compile --generate-hashes`` writes it; ``invoke stack.lock`` does) fixes all of
them: the agent installs exactly it with hashes required, the lock's hash is part of the
environment's name, and ``stack.check`` reports any package that drifted from it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from vigil.desired.packages import normalize, same_version
from vigil.errors import ConfigError

_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")



@dataclass(frozen=True)
class Lock:
    text: str
    pins: dict[str, str]  # normalised name -> exact version
    hashes: dict[str, tuple[str, ...]]

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Requirement lines with their continuations joined, comments dropped."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def parse(text: str, file: str) -> Lock:
    """The lock's pins and hashes; one clear error naming the line for anything else (a
    range, a URL, an option that would send the installer elsewhere)."""
    pins: dict[str, str] = {}
    hashes: dict[str, tuple[str, ...]] = {}
    for n, line in _logical_lines(text):
        m = _REQ.match(line)
        if m is None:
            raise ConfigError(
                f"line {n}: {line[:80]!r} is not an exact requirement (name==version)",
                file=file, fix="regenerate it: invoke stack.lock --stack NAME")
        name = normalize(m.group(1))
        if name in pins:
            raise ConfigError(f"line {n}: {m.group(1)} is locked twice", file=file,
                              fix="regenerate it: invoke stack.lock --stack NAME")
        found = tuple(_HASH.findall(line))
        if not found:
            raise ConfigError(f"line {n}: {m.group(1)}=={m.group(2)} has no --hash", file=file,
                              fix="regenerate it with hashes: invoke stack.lock --stack NAME")
        pins[name], hashes[name] = m.group(2), found
    if not pins:
        raise ConfigError("the lock lists no package", file=file,
                          fix="regenerate it: invoke stack.lock --stack NAME")
    return Lock(text, pins, hashes)



def stale_pins(lock: Lock, packages: dict[str, str]) -> list[str]:
    """The stack's own pins the lock disagrees with (the stack changed since it was
    locked): each as ``name: stack ==X, lock ==Y``."""
    out = []
    for name, version in packages.items():
        have = lock.pins.get(normalize(name))
        if have is None:
            out.append(f"{name}: stack =={version}, not in the lock")
        elif not same_version(have, version):
            out.append(f"{name}: stack =={version}, lock =={have}")
    return out


def drift(lock: Lock, installed: dict[str, str],
          removed: list[str]) -> list[tuple[str, str, str | None]]:
    """Packages of an environment that differ from its lock: (name, locked, installed or
    None), the stack's removals excepted; a package the lock does not list is (name, '',
    version)."""
    gone = {normalize(n) for n in removed}
    out: list[tuple[str, str, str | None]] = []
    for name, version in sorted(lock.pins.items()):
        if name in gone:
            continue
        have = installed.get(name)
        if have is None or not same_version(have, version):
            out.append((name, version, have))
    for name, have in sorted(installed.items()):
        if name not in lock.pins and name not in gone and name not in _TOOLING:
            out.append((name, "", have))
    return out


# what a venv brings of its own (pip's seed), never in a lock of the stack's packages
_TOOLING = {"pip", "setuptools", "wheel"}


def file_of(stack_name: str) -> str:
    return f"stacks/{stack_name}.lock"
