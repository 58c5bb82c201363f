"""What a host is like now: the agent's ``facts`` reply, parsed straight into a pydantic
model (pure). Field names follow the agent's JSON; derived views are properties."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from vigil.deploy.gpus import GpuFacts, GpuParseError, from_agent
from vigil.deploy.weights import ModelFiles
from vigil.deploy.weights import parse as parse_model_files
from vigil.errors import HostError


def _int(value: object) -> int:
    """systemd prints numbers as text, and an empty MainPID= for no process."""
    try:
        return int(str(value))
    except ValueError:
        return 0


Count = Annotated[int, BeforeValidator(_int)]


class _Facts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", arbitrary_types_allowed=True,
                              populate_by_name=True)


class ServiceState(_Facts):
    """`systemctl show` of the unit, as the agent relays it."""

    load_state: str = Field("", alias="LoadState")
    active_state: str = Field("", alias="ActiveState")
    sub_state: str = Field("", alias="SubState")
    main_pid: Count = Field(0, alias="MainPID")
    n_restarts: Count = Field(0, alias="NRestarts")
    unit_file_state: str = Field("", alias="UnitFileState")
    error: str | None = None  # systemctl show failed (its stderr)

    @property
    def running(self) -> bool:
        return self.active_state in ("active", "activating", "reloading")


class InitFacts(_Facts):
    """Who runs the host: ``booted`` when systemd is PID 1 (sd_booted), PID 1's name."""

    booted: bool | None = None
    pid1: str | None = None


class ReleaseFiles(_Facts):
    """The unit and env file as they are: text, None when absent, {"error"} unreadable."""

    unit: str | dict[str, str] | None = None
    env: str | dict[str, str] | None = None


class ModelDir(_Facts):
    kind: str = "hub-id"  # "path" or "hub-id"
    exists: bool | None = None
    config: dict[str, Any] | None = None
    weights: dict[str, Any] = Field(default_factory=dict)
    files: ModelFiles | None = Field(None, validation_alias="layouts")

    @property
    def present(self) -> bool | None:  # None: a hub id, not a path
        return self.exists if self.kind == "path" else None


class PortOwner(_Facts):
    pid: int
    cmdline: str | None = None


class Port(_Facts):
    listening: bool = False
    owners: tuple[PortOwner, ...] = ()


def _gpus(raw: Any) -> GpuFacts:
    try:
        return from_agent(raw)
    except GpuParseError as exc:
        raise ValueError(f"cannot read its GPUs: {exc}") from None


def _model(raw: Any) -> Any:
    if isinstance(raw, dict) and "layouts" in raw:
        return {**raw, "layouts": parse_model_files(raw.get("layouts"))}
    return raw


class HostFacts(_Facts):
    uid: int
    files: ReleaseFiles
    writable: dict[str, bool]
    current_env: str | None = Field(None, alias="current")  # where `current` points
    env_complete: bool = False
    packages: dict[str, str] | None = None
    env_error: str | None = None
    service: ServiceState = Field(default_factory=lambda: ServiceState.model_validate({}))
    health: dict[str, Any] | None = None  # the agent's GET /health, when active
    service_user_exists: bool = False
    model: Annotated[ModelDir, BeforeValidator(_model)] = Field(
        default_factory=lambda: ModelDir.model_validate({}))
    disk_free_bytes: int = 0
    env_dir: str | None = None  # the stack's environment in use (ENV_DIR or ENV_DIR-rN)
    envs: tuple[tuple[str, float, bool], ...] = ()  # (path, mtime, complete) under env_root
    backup_env: str | None = None  # the environment the kept release points to
    service_pids: tuple[int, ...] = ()
    port: Port = Field(default_factory=Port)
    uv: str | None = None
    gpus_raw: dict[str, Any] | None = Field(None, alias="gpus", repr=False)
    gpus: Annotated[GpuFacts, BeforeValidator(_gpus)] = Field(
        default_factory=lambda: GpuFacts("none"), validation_alias="gpus")
    roles: dict[str, Any] | None = None  # user roles' files and units (role_facts)
    caches: tuple[str, ...] | None = None  # compile-cache entries held (seeding's facts)
    # the environment's vLLM server parser: {"version", "flags"} or {"error"}
    vllm_flags: dict[str, Any] | None = None
    init: InitFacts = Field(default_factory=lambda: InitFacts.model_validate({}))

    @property
    def unit_text(self) -> str | None:
        return self.files.unit if isinstance(self.files.unit, str) else None

    @property
    def env_text(self) -> str | None:
        return self.files.env if isinstance(self.files.env, str) else None

    @property
    def release_exists(self) -> bool:
        """Something is deployed here: a deploy keeps it for rollback."""
        return self.unit_text is not None or self.env_text is not None or bool(self.current_env)

    @property
    def env_unreadable(self) -> bool:
        return isinstance(self.files.env, dict)

    @property
    def health_status(self) -> int | None:
        status = (self.health or {}).get("status")
        return status if isinstance(status, int) else None

    @property
    def port_listening(self) -> bool:
        return self.port.listening

    @property
    def port_owners(self) -> tuple[tuple[int, str | None], ...]:  # (pid, command line)
        return tuple((o.pid, o.cmdline) for o in self.port.owners)

    @property
    def gpu_cmdlines(self) -> dict[str, str | None]:
        return dict((self.gpus_raw or {}).get("cmdlines") or {})

    @property
    def gpu_starts(self) -> dict[str, int | None]:
        """PID -> start time (ticks since boot): what --kill-stale re-checks on the host."""
        return dict((self.gpus_raw or {}).get("starts") or {})


def parse_facts(host: str, data: dict[str, Any]) -> HostFacts:
    """The agent's `facts` reply (already decoded by remote.call), validated."""
    try:
        return HostFacts.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        if "error" in err.get("ctx", {}):  # one of ours, e.g. unreadable GPU readings
            raise HostError(host, str(err["ctx"]["error"])) from None
        where = ".".join(str(p) for p in err["loc"])
        raise HostError(host, f"unexpected facts reply: {where}: {err['msg']}") from None
