"""User roles (roles/<name>/role.yml): desired files and units + facts -> actions (pure).

The same shape as the service plan: a file is written only when its text, mode or
owner differ; units are reloaded when a unit file changed; a unit restarts only when a
file that names it changed, or when it should run and does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vigil.deploy.plan import Action, unified
from vigil.desired.roles import RenderedRole


@dataclass(frozen=True)
class RoleFacts:
    """The agent's ``role_facts`` reply: each file as it is, each unit's state."""

    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    units: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def parse_role_facts(data: Mapping[str, Any] | None) -> RoleFacts:
    data = data or {}
    return RoleFacts(dict(data.get("files") or {}), dict(data.get("units") or {}))


def request(roles: tuple[RenderedRole, ...]) -> dict[str, list[str]]:
    """What the agent must read for these roles (one round trip)."""
    files = [f.dest for r in roles for f in r.files]
    units = list(dict.fromkeys(u for r in roles for u in r.units))
    return {"files": files, "units": units}


def _owner_of(state: Mapping[str, Any]) -> str:
    return f"{state.get('owner')}:{state.get('group')}"


def plan_roles(roles: tuple[RenderedRole, ...], facts: RoleFacts) -> list[Action]:
    writes: list[Action] = []
    restart: dict[str, str] = {}
    reload = False
    for role in roles:
        for f in role.files:
            state = facts.files.get(f.dest) or {}
            old = state.get("text")
            reasons = []
            if old is None:
                reasons.append("new file")
            elif old != f.content:
                reasons.append("content changed")
            if old is not None and state.get("mode") != f.mode:
                reasons.append(f"mode {state.get('mode')} -> {f.mode}")
            want_owner = f.owner if ":" in f.owner else None
            have = _owner_of(state)
            if old is not None and (have != want_owner if want_owner else
                                    state.get("owner") != f.owner):
                reasons.append(f"owner {have} -> {f.owner}")
            if not reasons:
                continue
            writes.append(Action(
                "write_file", f"{role.name}: {f.dest}: {', '.join(reasons)}",
                {"path": f.dest, "content": f.content, "mode": f.mode, "owner": f.owner},
                unified(f.dest, old, f.content) if old != f.content else "",
            ))
            reload = reload or f.is_unit
            if f.restart:
                restart.setdefault(f.restart, f"{role.name}: {f.dest} changed")
    actions = list(writes)
    if reload:
        actions.append(Action("systemctl", "a role's unit file changed",
                              {"args": ["daemon-reload"]}))
    for role in roles:
        for unit in role.enable:
            state = facts.units.get(unit) or {}
            if state.get("UnitFileState") != "enabled":
                actions.append(Action("systemctl", f"{role.name}: start at boot",
                                      {"args": ["enable", unit]}))
            if state.get("ActiveState") not in ("active", "activating", "reloading"):
                restart.setdefault(unit, f"{role.name}: {unit} is "
                                   f"{state.get('ActiveState') or 'not loaded'}")
    actions += [Action("restart", reason, {"unit": unit}) for unit, reason in restart.items()]
    return actions


def with_role_backup(service: tuple[Action, ...], role_actions: list[Action],
                     roles: tuple[RenderedRole, ...], *, release_exists: bool,
                     ) -> tuple[Action, ...]:
    """The whole plan, with the roles' files to be written kept by the release backup, so
    a rollback puts them back (or removes them again) along with the unit and env."""
    restart_of = {f.dest: f.restart for r in roles for f in r.files}
    files = [{"path": a.payload["path"], "restart": restart_of.get(a.payload["path"])}
             for a in role_actions if a.kind == "write_file"]
    if not files:
        return service + tuple(role_actions)
    if any(a.kind == "backup" for a in service):
        service = tuple(replace(a, payload={**a.payload, "files": files})
                        if a.kind == "backup" else a for a in service)
        return service + tuple(role_actions)
    if not release_exists:  # nothing deployed yet: there is no release to roll back to
        return service + tuple(role_actions)
    keep = Action("backup", "keep the running release and the roles' files for rollback",
                  {"files": files})
    return (*service, keep, *tuple(role_actions))
