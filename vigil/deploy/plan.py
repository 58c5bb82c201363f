"""Desired state + facts -> the actions that make a host match, each with a reason (pure).

Like a pyinfra operation, a plan yields nothing when the host already matches; like an
Ansible handler, the service restarts only when something it depends on changed.
"""

from __future__ import annotations

import difflib
import os
import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from vigil.deploy.facts import HostFacts
from vigil.deploy.runtime import (
    collect,
    in_use,
    install_dir,
    install_payload,
    runtime_differences,
)
from vigil.desired.config import HostVars
from vigil.desired.render import Rendered, redact_env_text
from vigil.desired.stacks import Stack
from vigil.errors import RefusedError


class ActionKind(StrEnum):
    """What a plan's step does: one applier each in vigil/host/apply.py (APPLIERS, whose
    keys are these strings: the host side is stdlib only). A member is its string on the
    wire, in --check and in the JSON (HostResult.applied)."""

    INSTALL_ENV = "install_env"  # build the stack's environment beside the live one
    DISCARD_ENV = "discard_env"  # remove a new environment that failed verification
    MARK_ENV = "mark_env"  # mark a verified environment complete
    BACKUP = "backup"  # keep the running release for rollback
    SWITCH_ENV = "switch_env"  # point the environment link at the target
    REMOVE_ENVS = "remove_envs"  # collect old environments
    WRITE_ENV = "write_env"
    WRITE_UNIT = "write_unit"
    WRITE_FILE = "write_file"  # a user role's file
    SYSTEMCTL = "systemctl"  # daemon-reload, enable
    KILL = "kill"  # --kill-stale
    SEED_CACHE = "seed_cache"  # a compile cache from a ready start of the same key
    RESTART = "restart"


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str
    payload: dict[str, Any] = field(default_factory=dict)
    diff: str = ""  # unified diff, secrets masked
    # A step that runs only on this condition, not in its turn: apply sends it then and
    # only then, and --check shows it with the condition (the plan is the whole truth).
    when: str = ""

    def wire(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.payload}

    def describe(self) -> str:
        label = self.kind if self.kind != ActionKind.SYSTEMCTL else \
            "systemctl " + " ".join(self.payload["args"])
        return f"{label}{f' (if {self.when})' if self.when else ''}: {self.reason}"


@dataclass(frozen=True)
class Plan:
    host: str
    actions: tuple[Action, ...]
    restarts: bool

    @property
    def changes(self) -> bool:
        return bool(self.actions)

    def describe(self) -> list[str]:
        if not self.actions:
            return ["nothing to do"]
        return [a.describe() for a in self.actions]

    def step(self, kind: ActionKind) -> Action | None:
        """The plan's first step of this kind (apply sends the install's steps alone)."""
        return next((a for a in self.actions if a.kind == kind), None)


def _unit_keys(text: str | None) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in (text or "").splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            keys.setdefault(key, []).append(value)
    return keys


# An ExecStart vigil writes is a few hundred bytes; shlex takes a long word a character
# at a time (quadratic: a host's 6 MB ExecStart spun 16 min), so past this it is not split.
EXEC_START_MAX = 64 * 1024


def exec_words(line: str) -> list[str] | None:
    """An ExecStart line's words as the shell would split them, or None: too long to be
    vigil's, or not shell words (unbalanced quotes in a unit someone else wrote)."""
    if len(line) > EXEC_START_MAX:
        return None
    try:
        return shlex.split(line)
    except ValueError:
        return None


def unit_change_reason(old: str | None, new: str) -> str:
    if old is None:
        return "new unit"
    before, after = _unit_keys(old), _unit_keys(new)
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    if not changed:
        return "comments changed"
    parts = []
    for key in changed:
        was, now = (exec_words(before[key][0]), exec_words(after[key][0])) \
            if key == "ExecStart" and key in before and key in after else (None, None)
        if was is not None and now is not None:
            a, b = set(was), set(now)
            removed = " ".join(sorted(a - b))
            added = " ".join(sorted(b - a))
            parts.append(f"ExecStart changed ({removed or '-'} -> {added or '-'})")
        else:
            parts.append(f"{key} changed")
    return ", ".join(parts)


def _env_names(text: str | None) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[name] = value
    return out


def env_change_reason(old: str | None, new: str, secrets: frozenset[str]) -> str:
    if old is None:
        return "new environment file"
    before, after = _env_names(old), _env_names(new)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if not changed:
        return "comments changed"
    shown = [f"{k} (secret)" if k in secrets else k for k in changed]
    return "changed: " + ", ".join(shown)


def unified(path: str, old: str | None, new: str) -> str:
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"{path} (host)" if old is not None else "/dev/null",
        tofile=f"{path} (desired)",
    )
    return "".join(lines)


# Keys the hashes of masked values: equal values hash equal within one run (a diff
# shows what changed), and the hash of a short secret cannot be looked up elsewhere.
_DIFF_KEY = os.urandom(32)


def env_diff(r: Rendered, host_text: str | None) -> str:
    """The env file diff with every value vigil does not render in the open masked:
    secrets, and variables found only on the host (a DB_PASS someone added)."""
    public = frozenset(n for n in r.env if n not in r.secret_names)
    # the template's own comments; a comment found only on the host may hold anything
    shown = frozenset(line for line in r.env_text.split("\n") if line.startswith("#"))
    return unified(r.paths.env,
                   None if host_text is None else redact_env_text(host_text, public, shown,
                                                                  _DIFF_KEY),
                   redact_env_text(r.env_text, public, shown, _DIFF_KEY))


def make_plan(
    host_name: str,
    stack: Stack,
    r: Rendered,
    facts: HostFacts,
    *,
    force_restart: bool = False,
    reinstall: bool = False,
    kill_pids: tuple[int, ...] = (),
    host: HostVars | None = None,
) -> Plan:
    """The runtime and service roles' plan: one release (environment, unit, env file).
    ``host`` gives the roles' settings (keep_envs, installer, min_free_gib)."""
    hv = host or HostVars.model_validate({})
    runtime = plan_runtime(host_name, stack, r, facts, reinstall=reinstall, host=hv)
    return plan_service(host_name, r, facts, runtime, force_restart=force_restart,
                        kill_pids=kill_pids, host=hv)


@dataclass(frozen=True)
class RuntimePlan:
    """The runtime role's part: what to build, and the environment the release runs."""

    install: Action | None
    target: str
    differences: tuple[str, ...]  # pins and rules the live environment breaks
    mark: Action | None = None  # marks the installed environment complete, once verified
    discard: Action | None = None  # removes it instead, when it fails verification


def plan_runtime(host_name: str, stack: Stack, r: Rendered, facts: HostFacts, *,
                 reinstall: bool, host: HostVars) -> RuntimePlan:
    """Runtime role (pure): an install beside the live environment when the pins or
    rules differ (or --reinstall), refused without the free disk it needs."""
    hv = host
    min_free = int(hv.min_free_gib * 2**30)
    runtime = runtime_differences(stack, facts)
    target = in_use(r.paths.env_dir, facts)
    install = mark = discard = None
    if runtime or reinstall:
        if facts.disk_free_bytes < min_free:
            raise RefusedError(
                f"{host_name}: {facts.disk_free_bytes / 2**30:.1f} GiB free under "
                f"{r.paths.env_dir}; an environment needs {hv.min_free_gib:g} GiB",
                fix="free disk space on the host (or lower min_free_gib)",
            )
        # built beside the live environment; switched only after it passed verification
        target = install_dir(r.paths.env_dir, facts)
        install = Action(ActionKind.INSTALL_ENV, "; ".join(runtime) or "--reinstall",
                         install_payload(stack, target, r.paths.current,
                                         installer=hv.installer))
        discard = Action(ActionKind.DISCARD_ENV, f"remove {target}, which the running release "
                         "never used; nothing after it runs", {"env_dir": target},
                         when="the new environment fails verification")
        mark = Action(ActionKind.MARK_ENV, f"mark {target} complete once it passed verification "
                      "(pins, rules, pip check, imports); a failed one is discarded and "
                      "nothing after it runs", {"env_dir": target})
    return RuntimePlan(install, target, tuple(runtime), mark, discard)


def plan_service(host_name: str, r: Rendered, facts: HostFacts, runtime: RuntimePlan, *,
                 force_restart: bool, kill_pids: tuple[int, ...], host: HostVars) -> Plan:
    """Service role (pure): switch to the runtime's environment, write the unit and env
    file, keep the replaced release, restart only when something it runs changed."""
    hv = host
    # the install, then what follows its verification: a discard if it fails, else a mark
    actions = [a for a in (runtime.install, runtime.discard, runtime.mark) if a is not None]
    target = runtime.target
    switch = facts.current_env != target
    unit_changed = facts.unit_text != r.unit_text
    env_changed = facts.env_text != r.env_text
    writes: list[Action] = []
    if switch:
        writes.append(Action(
            ActionKind.SWITCH_ENV, f"environment link {facts.current_env or '(none)'} -> {target}",
            {"target": target},
        ))
    if env_changed:
        writes.append(Action(
            ActionKind.WRITE_ENV, env_change_reason(facts.env_text, r.env_text, r.secret_names),
            {"content": r.env_text, "mode": "600"},
            env_diff(r, facts.env_text),
        ))
    if unit_changed:
        writes.append(Action(
            ActionKind.WRITE_UNIT, unit_change_reason(facts.unit_text, r.unit_text),
            {"content": r.unit_text, "mode": "644"}, unified(r.paths.unit, facts.unit_text,
                                                             r.unit_text),
        ))
    existed = facts.release_exists
    if writes and existed:
        actions.append(Action(ActionKind.BACKUP, "keep the running release for rollback"))
    actions += writes
    if switch:
        old = collect(facts, {target}, hv.keep_envs, backup_replaced=bool(existed))
        if old:
            actions.append(Action(ActionKind.REMOVE_ENVS, "keep the newest environments: "
                                  f"{len(old)} old one(s) collected", {"paths": old}))
    unit = r.paths.unit.rsplit("/", 1)[1]
    if unit_changed:
        actions.append(Action(ActionKind.SYSTEMCTL, "unit file changed",
                              {"args": ["daemon-reload"]}))
    if facts.service.unit_file_state != "enabled":
        actions.append(Action(ActionKind.SYSTEMCTL, "start at boot", {"args": ["enable", unit]}))
    changed = [what for what, flag in (("runtime", bool(runtime.differences) or switch),
                                       ("unit", unit_changed), ("env", env_changed)) if flag]
    restarts = False
    if changed or force_restart:
        reason = f"{', '.join(changed)} changed" if changed else "--restart"
        restarts = True
    elif not facts.service.running:
        reason = f"service is {facts.service.active_state or 'not loaded'}"
        restarts = True
    if kill_pids:
        actions.append(Action(ActionKind.KILL, "--kill-stale: processes outside the service "
                              "hold GPU memory: " + ", ".join(str(p) for p in kill_pids),
                              {"pids": list(kill_pids), "expect": {
                                  str(p): {"start": facts.gpu_starts.get(str(p)),
                                           "cmdline": facts.gpu_cmdlines.get(str(p))}
                                  for p in kill_pids}}))
    if restarts:
        actions.append(Action(ActionKind.RESTART, reason, {"unit": unit}))
    return Plan(host_name, tuple(actions), restarts)
