"""One probe snapshot as typed values, and its JSON form.

The host agent's `probe` verb (vigil/host/probe.py, stdlib-only, runs on the host)
replies with this shape; the watcher parses it with `Snapshot.from_dict`, and traces
store one per line (`to_json`/`from_json`). Every part
may carry an `error` instead of data: a probe never fails as a whole. Missing parts
parse as "not observed" (None), which the reducer treats as no evidence either way.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from vigil.errors import HostError


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Unit(_Value):
    name: str = ""
    active_state: str = ""  # active, activating, deactivating, inactive, failed
    sub_state: str = ""  # running, start, auto-restart, dead, failed, …
    main_pid: int = 0
    n_restarts: int = 0
    exec_main_status: int = 0
    exec_main_start_us: int = 0  # CLOCK_MONOTONIC µs, as systemd reports it
    exec_main_start_epoch: float | None = None  # derived on the host
    control_group: str = ""
    invocation_id: str = ""  # this run of the unit; journald tags its lines with it
    error: str | None = None


class LogLine(_Value):
    us: int  # __REALTIME_TIMESTAMP: epoch µs
    text: str


class Journal(_Value):
    lines: tuple[LogLine, ...] = ()
    cursor: str | None = None
    truncated: bool = False  # more lines were waiting; the cursor points at the last kept
    error: str | None = None


class Proc(_Value):
    pid: int
    ppid: int = 0
    comm: str = ""
    cmdline: str = ""
    state: str = ""  # R S D Z T …
    cpu_s: float = 0.0  # utime + stime
    rss_bytes: int = 0


class Processes(_Value):
    source: str = "none"  # cgroup | proc-tree | none
    items: tuple[Proc, ...] = ()
    error: str | None = None

    @property
    def cpu_s(self) -> float:
        return sum(p.cpu_s for p in self.items)

    @property
    def rss_bytes(self) -> int:
        return sum(p.rss_bytes for p in self.items)


class CpuLoad(_Value):
    """Whether the host gives the tree the CPU it asks for: counters, compared between
    polls by the reducer (None: not readable on this host)."""

    cgroup: str = ""  # v2 | v1: where the unit's cpu.stat was read; "" none
    nr_periods: int | None = None  # CFS bandwidth periods (a CPUQuota set)
    nr_throttled: int | None = None  # periods in which the quota ran out
    throttled_us: int | None = None
    usage_us: int | None = None
    pressure_some_us: int | None = None  # the unit's cpu.pressure, `some` total (µs)
    host_pressure_some_us: int | None = None  # /proc/pressure/cpu, `some` total (µs)
    steal_ticks: int | None = None  # /proc/stat: a hypervisor ran someone else
    total_ticks: int | None = None
    error: str | None = None


class GpuProc(_Value):
    pid: int
    used_mib: float = 0.0


class Gpu(_Value):
    index: int
    name: str = ""
    memory_used_mib: float = 0.0
    memory_total_mib: float = 0.0
    processes: tuple[GpuProc, ...] = ()


class Gpus(_Value):
    source: str = ""  # nvml | nvidia-smi
    devices: tuple[Gpu, ...] = ()
    error: str | None = None

    @property
    def used_mib(self) -> float:
        return sum(g.memory_used_mib for g in self.devices)


class CacheDir(_Value):
    path: str
    exists: bool = False
    bytes: int = 0
    files: int = 0
    newest_mtime: float | None = None
    oldest_mtime: float | None = None  # with the unit's start time: cold or warm
    truncated: bool = False
    error: str | None = None


class Cache(_Value):
    dirs: tuple[CacheDir, ...] = ()
    error: str | None = None

    @property
    def bytes(self) -> int:
        return sum(d.bytes for d in self.dirs)

    @property
    def files(self) -> int:
        return sum(d.files for d in self.dirs)

    @property
    def newest_mtime(self) -> float | None:
        stamps = [d.newest_mtime for d in self.dirs if d.newest_mtime is not None]
        return max(stamps) if stamps else None

    @property
    def readable(self) -> bool:
        """True when the walk saw every directory it was asked for (or it did not exist)."""
        return self.error is None and all(d.error is None for d in self.dirs)


class Http(_Value):
    health_status: int | None = None
    health_error: str | None = None
    models: tuple[str, ...] | None = None
    models_error: str | None = None


class Smoke(_Value):
    """A real completion's outcome. Filled by the watcher, never by the probe."""

    ok: bool
    tokens: int = 0
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    error: str | None = None


class Snapshot(_Value):
    time: float  # epoch seconds on the host
    unit: Unit | None = None
    journal: Journal = Journal()
    processes: Processes | None = None
    cpu_load: CpuLoad | None = None  # None: an older agent, or not observed
    gpus: Gpus | None = None  # None: no NVML and no nvidia-smi (a CPU host)
    cache: Cache | None = None
    http: Http | None = None
    smoke: Smoke | None = None
    errors: tuple[str, ...] = ()  # probe-level failures outside any part

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> Snapshot:
        """Parse one snapshot; ValueError with the reason when the text is not one."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise ValueError(f"not a vigil snapshot: {_first_error(exc)}") from exc

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"not a vigil snapshot: {_first_error(exc)}") from exc

    @classmethod
    def from_reply(cls, host: str, data: dict[str, Any]) -> Snapshot:
        """A host's probe reply (a poll's or the stream's); a HostError when it is not a
        snapshot, so the watch meets one error tree, not ValueError beside it."""
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise HostError(host, str(exc)) from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid"))
