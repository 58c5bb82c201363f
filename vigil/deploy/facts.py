"""What a host is like now, parsed from the agent's ``facts`` reply (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vigil.deploy.gpus import GpuFacts, GpuParseError, from_agent
from vigil.deploy.weights import ModelFiles
from vigil.deploy.weights import parse as parse_model_files
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
    # runtime and preflight (issue 3); defaults keep older agents' replies parseable
    env_dir: str | None = None  # the stack's environment in use (ENV_DIR or ENV_DIR-rN)
    envs: tuple[tuple[str, float, bool], ...] = ()  # (path, mtime, complete) under env_root
    backup_env: str | None = None  # the environment the kept release points to
    service_pids: tuple[int, ...] = ()
    port_listening: bool = False
    port_owners: tuple[tuple[int, str | None], ...] = ()  # (pid, command line)
    uv: str | None = None
    gpus: GpuFacts = field(default_factory=lambda: GpuFacts("none"))
    gpu_cmdlines: dict[str, str | None] = field(default_factory=dict)
    model_weights: dict[str, Any] = field(default_factory=dict)
    model_files: ModelFiles | None = None  # safetensors headers, config, tokenizer
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


def parse_facts(host: str, data: dict[str, Any]) -> HostFacts:
    """The agent's `facts` reply (already decoded by remote.call) as typed values."""
    if not isinstance(data.get("files"), dict):
        raise HostError(host, f"unexpected facts reply: {str(data)[:300]}")
    files = data["files"]
    env = files.get("env")
    model = data.get("model") or {}
    health = data.get("health") or {}
    port = data.get("port") or {}
    try:
        gpus = from_agent(data.get("gpus"))
    except GpuParseError as exc:
        raise HostError(host, f"cannot read its GPUs: {exc}") from None
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
        env_dir=data.get("env_dir"),
        envs=tuple((str(e[0]), float(e[1]), bool(e[2])) for e in data.get("envs") or ()),
        backup_env=data.get("backup_env"),
        service_pids=tuple(int(p) for p in data.get("service_pids") or ()),
        port_listening=bool(port.get("listening")),
        port_owners=tuple((int(o["pid"]), o.get("cmdline")) for o in port.get("owners", ())),
        uv=data.get("uv"),
        gpus=gpus,
        gpu_cmdlines=dict((data.get("gpus") or {}).get("cmdlines") or {}),
        model_weights=dict(model.get("weights") or {}),
        model_files=parse_model_files(model.get("layouts")),
        raw=data,
    )
