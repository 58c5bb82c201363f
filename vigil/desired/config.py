"""Desired state as validated values: host variables, model profiles, the hosts file
(a stack's record lives with its rule engine in ``stacks.py``).

Only shapes and per-file rules live here; loading and merging is ``inventory.py``.
Every model forbids unknown keys so a typo is an error, not a silently ignored key.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

# Values end up in a systemd unit and an environment file: no control characters,
# so a value can never start a new line (a new key) there; nor C1 controls and U+2028/
# U+2029, which Python's splitlines (and many viewers) take for line ends.
_SAFE_TEXT = re.compile(r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]*\$?$")
_FINGERPRINT = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")

SafeText = Annotated[str, Field(pattern=_SAFE_TEXT.pattern)]
# One pattern for every name that becomes part of a path on a host or here (host,
# profile, stack, role): no '/', no leading '.', so never '..' nor a hidden file.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# The phases verify watches, by name, for phase_budget_s and stall_window_s. The phase
# catalog (vigil.verify.catalog) is the source; it lives above this layer, so the names
# are repeated here and tests/unit/test_inventory.py holds the two equal.
WATCHED_PHASES: tuple[str, ...] = ("bootstrap", "engine_init", "distributed_init",
                                   "loading_weights", "compiling", "kv_cache",
                                   "capturing_graphs", "api_starting")


def unknown_phase(phases: object) -> str | None:
    """The first name of a phase_budget_s or stall_window_s mapping that verify does not
    watch, or None."""
    if isinstance(phases, dict):
        return next((str(n) for n in phases if n not in WATCHED_PHASES), None)
    return None


def phase_error(name: str) -> str:
    close = difflib.get_close_matches(name, WATCHED_PHASES, n=1)
    return f"no watched phase named {name!r}" + (f" - did you mean {close[0]!r}?" if close
                                                  else "")


def _abs_path(v: str) -> str:
    if not v.startswith("/") or not _SAFE_TEXT.fullmatch(v) or ".." in v.split("/"):
        raise ValueError("must be an absolute path without control characters or '..'")
    return v


def check_name(kind: str, v: str) -> str:
    if not NAME.fullmatch(v):
        raise ValueError(
            f"{kind} name {v[:120]!r} must be 1-100 letters, digits, '_', '.' or '-', not "
            "starting with '.' or '-' (it becomes part of a path)"
        )
    return v


_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252}[A-Za-z0-9_.])?")


def check_address(v: str) -> str:
    """A host name, an IPv4 or a bare IPv6 address: the user and the port have their own
    keys (ssh_user, ssh_port), so ``user@host``, ``host:port`` and ``[::1]`` are refused."""
    fix = "address is a host name or IP; the user goes in ssh_user, the port in ssh_port"
    if not v:
        raise ValueError(f"must not be empty ({fix})")
    if "@" in v:
        raise ValueError(f"{v[:120]!r} holds a user ({fix})")
    if ":" in v or "[" in v:
        try:
            ipaddress.IPv6Address(v)
        except ValueError:
            raise ValueError(f"{v[:120]!r} is not a host name nor an IPv6 address (a port "
                             f"or brackets?) ({fix})") from None
        return v
    if not _HOST_NAME.fullmatch(v):
        raise ValueError(f"{v[:120]!r} is not a host name ({fix})")
    return v


Name = Annotated[str, AfterValidator(lambda v: check_name("the", v))]

AbsPath = Annotated[str, AfterValidator(_abs_path)]


class Strict(BaseModel):
    # strict: no coercion, so `port: true` is an error, not --port=1, and "8000" is no int
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"environment name {name!r} is not a valid variable name")
        if not _SAFE_TEXT.fullmatch(value):
            raise ValueError(f"environment value of {name} contains a control character")
    return env


class Gpu(Strict):
    kind: SafeText = Field(description="e.g. 'RTX PRO 6000 Blackwell'")
    count: int = Field(ge=0)
    memory_gib: float = Field(gt=0)


class HostVars(Strict):
    """Variables of one host after merging all < group < host (< --set flags)."""

    # how to reach it
    address: SafeText = "127.0.0.1"
    connection: Literal["ssh", "local"] = "ssh"
    ssh_user: SafeText = "root"
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_key: SafeText | None = None
    known_hosts: SafeText | None = None
    # strict: the key must be in a known_hosts file ssh reads (or known_hosts above);
    # accept-new: trust on first use, written to known_hosts, a changed key refused.
    host_key: Literal["strict", "accept-new"] = "strict"
    host_key_fingerprints: list[str] = Field(
        default_factory=list, description="pinned keys, as ssh-keygen -l prints: SHA256:..."
    )
    # Removed: it accepted any key (and any impostor). Kept only to refuse it clearly.
    host_key_check: Literal[True] | None = None
    connect_timeout_s: float = Field(10.0, gt=0, le=3600)
    sudo: bool = False
    lock_timeout_s: float = Field(600.0, ge=0)
    # what it has
    gpu: Gpu | None = None
    # what runs there
    model: Name | None = None
    stack: Name | None = None
    service: str = "vllm"
    service_user: str = "vllm"
    bind: SafeText = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    env_root: AbsPath = "/opt/vigil/envs"
    config_dir: AbsPath = "/etc/vigil"
    unit_dir: AbsPath = "/etc/systemd/system"
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: list[str] = Field(
        default_factory=list,
        description="names whose values are taken from the operator's environment",
    )
    overrides: dict[str, object] = Field(
        default_factory=dict, description="model profile fields overridden for this host"
    )
    serve_timeout_s: float = Field(1800.0, gt=0)
    # compile caches: a ready start's cache seeds the next host of the same key
    cache_seed: bool = Field(True, description="seed this host's compile cache from a "
                             "ready start of the same key before it restarts")
    cache_seed_from: list[str] | None = Field(
        None, description="hosts or groups whose kept compile caches this host may run "
        "(a cache is code); a host's own is kept for others only when its list names it. "
        "[]: none. Unset: only a rollout's canary seeds (docs/caches.md)")
    cache_store: str | None = Field(None, description="the controller directory (a shared "
                                    "mount) that keeps compile caches; default: "
                                    "<state_dir>/caches")
    # Roles (roles/<name>/) this host takes; their defaults.yml hold the values below.
    roles: list[str] = Field(
        default_factory=lambda: ["preflight", "runtime", "service", "verify"]
    )
    # runtime role
    keep_envs: int = Field(3, ge=0, description="old environments kept besides the live ones")
    installer: Literal["auto", "uv", "pip"] = "auto"
    min_free_gib: float = Field(10.0, ge=0, description="free disk an install needs")
    # service role: unit settings
    restart_sec: int = Field(30, ge=0)
    start_limit_interval_s: int = Field(1800, ge=0)
    start_limit_burst: int = Field(3, ge=1)
    timeout_stop_s: int = Field(90, ge=1)
    limit_nofile: int = Field(1048576, ge=1024)
    # verify role: poll interval; per-phase budget and stall window with no history,
    # by phase name (over the phase catalog's own defaults)
    poll_s: float = Field(5.0, gt=0, le=300)
    phase_budget_s: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    stall_window_s: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    # preflight role: GPU health a deploy refuses (vigil.deploy.gpucheck)
    gpu_refuse_ecc_uncorrected: bool = True
    gpu_refuse_pending_retirement: bool = True  # pages/rows/repairs pending, unrepairable
    gpu_refuse_mig: bool = True
    gpu_require_persistence: bool = False
    gpu_refuse_xids: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140])
    gpu_xid_window_h: float = Field(24.0, gt=0, le=168)

    @field_validator("phase_budget_s", "stall_window_s")
    @classmethod
    def _phases(cls, v: dict[str, float]) -> dict[str, float]:
        # every task refuses a misspelled phase, not only the ones that watch a start
        bad = unknown_phase(v)
        if bad is not None:
            raise ValueError(f"{phase_error(bad)} (use one of: {', '.join(WATCHED_PHASES)})")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return check_address(v)

    @field_validator("service")
    @classmethod
    def _unit_name(cls, v: str) -> str:
        if not _UNIT_NAME.fullmatch(v):
            raise ValueError("must be a unit name: letters, digits, '_', '.', '@', '-'")
        return v

    @field_validator("service_user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not _USER_NAME.fullmatch(v):
            raise ValueError("must be a POSIX user name")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    @field_validator("host_key_check", mode="before")
    @classmethod
    def _no_opt_out(cls, v: object) -> object:
        if v is not True:
            raise ValueError(
                "host_key_check was removed: it accepted any host key, an impostor's "
                "too; pin the key with host_key_fingerprints: [SHA256:...] (ssh-keygen "
                "-lf), or trust it on first use with host_key: accept-new"
            )
        return v

    @field_validator("host_key_fingerprints")
    @classmethod
    def _fingerprints(cls, v: list[str]) -> list[str]:
        for fp in v:
            if not _FINGERPRINT.fullmatch(fp):
                raise ValueError(
                    f"{fp!r} is not a SHA256 fingerprint (write it as ssh-keygen -lf "
                    "prints it: SHA256: and 43 base64 characters)"
                )
        return v

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid variable name")
        return v


class ModelProfile(Strict):
    """How to serve one model: the vLLM arguments and what the model needs."""

    name: Name
    description: SafeText = ""
    path: SafeText = Field(description="the model directory on the host (or a hub id)")
    served_model_name: SafeText | None = None
    device: Literal["cuda", "cpu"] = "cuda"
    stack: Name | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    max_model_len: int = Field(ge=16, le=2**24)  # bounded if config.json is silent
    max_position_embeddings: int | None = Field(
        None, ge=16, description="the model's limit; refused above it"
    )
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: SafeText | None = None
    kv_cache_dtype: SafeText = "auto"
    max_num_seqs: int | None = Field(None, ge=1)
    enforce_eager: bool = False
    trust_remote_code: bool = False
    extra_args: list[SafeText] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    weights_gib_per_gpu: float = Field(gt=0, description="for budgets and disk checks")
    num_attention_heads: int | None = Field(None, ge=1)
    num_hidden_layers: int | None = Field(
        None, ge=1, description="config.json's; pipeline stages need a layer each")
    shutdown_timeout_s: int = Field(
        0, ge=0, description="vLLM --shutdown-timeout: in-flight requests may finish for this "
        "long on stop (0: aborted)")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        # `model` was the path until it collided with the host variable `model` (a
        # profile name): say the new key instead of a bare "unknown key".
        if isinstance(data, dict) and "model" in data:
            raise ValueError(
                "key 'model' was renamed to 'path' (the model's directory): "
                f"write path: {data['model']}"
            )
        return data

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for arg in v:
            if not arg.startswith("-"):
                raise ValueError(
                    f"{arg!r}: write each extra argument as one '--flag' or '--flag=value' item"
                )
        return v

    @model_validator(mode="after")
    def _limits(self) -> ModelProfile:
        limit = self.max_position_embeddings
        if limit is not None and self.max_model_len > limit:
            raise ValueError(
                f"max_model_len {self.max_model_len} is above the model's "
                f"max_position_embeddings {limit}"
            )
        heads = self.num_attention_heads
        if heads is not None and heads % self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} does not divide the "
                f"model's {heads} attention heads"
            )
        return self

    @property
    def gpus_needed(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


class Group(Strict):
    hosts: list[str] = Field(default_factory=list)
    vars: dict[str, object] = Field(default_factory=dict)


class HostsFile(Strict):
    # a host's own variables inline (address, ssh_port, gpu, ...), or nothing
    hosts: dict[str, dict[str, object] | None] = Field(default_factory=dict)
    groups: dict[str, Group] = Field(default_factory=dict)

    @field_validator("hosts", "groups")
    @classmethod
    def _names(cls, v: dict[str, object]) -> dict[str, object]:
        # a host's name names its trace and history files under state/
        for name in v:
            check_name("host or group", str(name))
        return v
