"""What a host is like now, parsed from the agent's ``facts`` reply (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vigil.errors import HostError


@dataclass(frozen=True)
class ServiceState:
    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    main_pid: int = 0
    n_restarts: int = 0
    unit_file_state: str = ""

    @property
    def running(self) -> bool:
        return self.active_state in ("active", "activating", "reloading")


@dataclass(frozen=True)
class HostFacts:
    uid: int
    unit_text: str | None
    env_text: str | None
    env_unreadable: bool
    writable: dict[str, bool]
    current_env: str | None
    env_complete: bool
    packages: dict[str, str] | None
    env_error: str | None
    service: ServiceState
    health_status: int | None
    service_user_exists: bool
    model_exists: bool | None  # None: a hub id, not a path
    model_config: dict[str, Any] | None
    disk_free_bytes: int
    has_backup: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def parse_service(props: dict[str, str]) -> ServiceState:
    return ServiceState(
        load_state=props.get("LoadState", ""),
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        main_pid=_int(props.get("MainPID", 0)),
        n_restarts=_int(props.get("NRestarts", 0)),
        unit_file_state=props.get("UnitFileState", ""),
    )


def parse_facts(host: str, stdout: str) -> HostFacts:
    try:
        data = json.loads(stdout)
    except ValueError:
        raise HostError(host, f"unexpected facts output: {stdout[:300]!r}") from None
    files = data["files"]
    env = files.get("env")
    model = data.get("model") or {}
    health = data.get("health") or {}
    return HostFacts(
        uid=int(data["uid"]),
        unit_text=files.get("unit") if isinstance(files.get("unit"), str) else None,
        env_text=env if isinstance(env, str) else None,
        env_unreadable=isinstance(env, dict),
        writable=dict(data["writable"]),
        current_env=data.get("current"),
        env_complete=bool(data.get("env_complete")),
        packages=data.get("packages"),
        env_error=data.get("env_error"),
        service=parse_service(data.get("service") or {}),
        health_status=health.get("status"),
        service_user_exists=bool(data.get("service_user_exists")),
        model_exists=model.get("exists") if model.get("kind") == "path" else None,
        model_config=model.get("config"),
        disk_free_bytes=int(data.get("disk_free_bytes", 0)),
        has_backup=bool(data.get("backup")),
        raw=data,
    )
