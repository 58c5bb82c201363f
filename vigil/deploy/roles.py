"""User roles (roles/<name>/role.yml): desired files and units + facts -> actions (pure).

The same shape as the service plan: a file is written only when its text, mode or
owner differ; units are reloaded when a unit file changed; a unit restarts only when a
file that names it changed, or when it should run and does not.

The agent sends a file's text only when vigil wrote it (the hash it recorded at the
write, or vigil's banner in a world-readable file), never through a symlink: any other
file is compared by its sha256, and ``--check`` names it and its hash, never its
content (a role placing /etc/shadow must not print its hashes into a CI log).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vigil.deploy.plan import Action, ActionKind, unified
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


def _present(state: Mapping[str, Any]) -> bool:
    return state.get("text") is not None or "sha256" in state or "kind" in state


def _content_reason(state: Mapping[str, Any], content: str) -> str | None:
    """Why the file's content is to be written (None: it is as desired)."""
    if not _present(state):
        return "new file"
    kind = state.get("kind", "file")
    if kind != "file":
        return f"replaces {state.get('error') or kind} on the host"
    if state.get("text") is not None:
        return None if state["text"] == content else "content changed"
    if "sha256" not in state:
        return f"content changed (the host's could not be read: {state.get('error')})"
    digest = hashlib.sha256(content.encode("utf-8")).hexdigest()
    return None if state["sha256"] == digest else "content changed"


def hidden_diff(path: str, state: Mapping[str, Any], new: str) -> str:
    """The diff of a file whose host content is not shown: its name, size and hash."""
    kind = state.get("kind", "file")
    if kind == "file" and "sha256" in state:
        what = f"{state.get('size')} bytes, sha256 {state['sha256']}"
    else:
        what = str(state.get("error") or kind)
    body = "".join(f"+{line}" for line in new.splitlines(keepends=True))
    if body and not body.endswith("\n"):
        body += "\n"
    return (f"--- {path} (host: {what}; not shown, vigil did not write it)\n"
            f"+++ {path} (desired)\n{body}")


def plan_roles(roles: tuple[RenderedRole, ...], facts: RoleFacts) -> list[Action]:
    writes: list[Action] = []
    restart: dict[str, str] = {}
    reload = False
    for role in roles:
        for f in role.files:
            state = facts.files.get(f.dest) or {}
            old = state.get("text")
            present = _present(state) and state.get("kind", "file") == "file"
            changed = _content_reason(state, f.content)
            reasons = [changed] if changed else []
            if present and state.get("mode") != f.mode:
                reasons.append(f"mode {state.get('mode')} -> {f.mode}")
            want_owner = f.owner if ":" in f.owner else None
            have = _owner_of(state)
            if present and (have != want_owner if want_owner else
                            state.get("owner") != f.owner):
                reasons.append(f"owner {have} -> {f.owner}")
            if not reasons:
                continue
            if not changed:
                diff = ""
            elif old is not None or not _present(state):
                diff = unified(f.dest, old, f.content)
            else:
                diff = hidden_diff(f.dest, state, f.content)
            if f.dest in role.allowed:
                reasons.append("allowed by roles/allow.yml")
            writes.append(Action(
                ActionKind.WRITE_FILE, f"{role.name}: {f.dest}: {', '.join(reasons)}",
                {"path": f.dest, "content": f.content, "mode": f.mode, "owner": f.owner},
                diff,
            ))
            reload = reload or f.is_unit
            if f.restart:
                restart.setdefault(f.restart, f"{role.name}: {f.dest} changed")
    actions = list(writes)
    if reload:
        actions.append(Action(ActionKind.SYSTEMCTL, "a role's unit file changed",
                              {"args": ["daemon-reload"]}))
    for role in roles:
        for unit in role.enable:
            state = facts.units.get(unit) or {}
            if state.get("UnitFileState") != "enabled":
                by = " (allowed by roles/allow.yml)" if unit in role.allowed else ""
                actions.append(Action(ActionKind.SYSTEMCTL, f"{role.name}: start at boot{by}",
                                      {"args": ["enable", unit]}))
            if state.get("ActiveState") not in ("active", "activating", "reloading"):
                restart.setdefault(unit, f"{role.name}: {unit} is "
                                   f"{state.get('ActiveState') or 'not loaded'}")
    actions += [Action(ActionKind.RESTART, reason, {"unit": unit})
                for unit, reason in restart.items()]
    return actions


def with_role_backup(service: tuple[Action, ...], role_actions: list[Action],
                     roles: tuple[RenderedRole, ...], *, release_exists: bool,
                     ) -> tuple[Action, ...]:
    """The whole plan, with the roles' files to be written kept by the release backup, so
    a rollback puts them back (or removes them again) along with the unit and env."""
    restart_of = {f.dest: f.restart for r in roles for f in r.files}
    files = [{"path": a.payload["path"], "restart": restart_of.get(a.payload["path"])}
             for a in role_actions if a.kind == ActionKind.WRITE_FILE]
    if not files:
        return service + tuple(role_actions)
    if any(a.kind == ActionKind.BACKUP for a in service):
        service = tuple(replace(a, payload={**a.payload, "files": files})
                        if a.kind == ActionKind.BACKUP else a for a in service)
        return service + tuple(role_actions)
    if not release_exists:  # nothing deployed yet: there is no release to roll back to
        return service + tuple(role_actions)
    keep = Action(ActionKind.BACKUP, "keep the running release and the roles' files for rollback",
                  {"files": files})
    return (*service, keep, *tuple(role_actions))
