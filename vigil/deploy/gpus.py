"""GPUs as the host reports them (pure parsers) and who holds their memory.

The agent prints raw readings (``agent.gpu_facts``): NVML through the environment's
python (``nvidia-ml-py``), or, when that is not importable, nvidia-smi's CSV:

    nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used \
               --format=csv,noheader,nounits          (MiB)
    nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory \
               --format=csv,noheader,nounits          (MiB, "[N/A]" when unknown)

A CPU host has neither: ``source == "none"`` and no GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MIB = 2**20
GIB = 2**30


class GpuParseError(ValueError):
    """The host printed something that is not the documented format."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: the driver does not say (e.g. inside a container)
    name: str | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class GpuFacts:
    source: str  # "nvml" | "nvidia-smi" | "none"
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    error: str | None = None  # why NVML was not used, when it was not

    @property
    def count(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class StaleProcess:
    pid: int
    gpus: tuple[int, ...]
    used_bytes: int | None
    cmdline: str | None

    def describe(self) -> str:
        held = f"{self.used_bytes / GIB:.1f} GiB" if self.used_bytes is not None else "? GiB"
        where = ",".join(str(g) for g in self.gpus)
        return f"pid {self.pid} holds {held} on GPU {where}: {self.cmdline or '(command unknown)'}"


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise GpuParseError(f"{what}: expected a number, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise GpuParseError(f"{what}: expected a number, got {value!r}") from None


def parse_nvml(data: Mapping[str, Any]) -> GpuFacts:
    """The agent's NVML reading: bytes, as nvmlDeviceGetMemoryInfo reports them."""
    if not isinstance(data.get("gpus"), list):
        raise GpuParseError(f"NVML reading has no 'gpus' list: {str(data)[:200]}")
    gpus = []
    for i, g in enumerate(data["gpus"]):
        procs = tuple(
            GpuProcess(_int(p.get("pid"), f"gpu {i} process pid"),
                       None if p.get("used_memory") is None
                       else _int(p["used_memory"], f"gpu {i} process memory"))
            for p in g.get("processes") or []
        )
        gpus.append(Gpu(
            index=_int(g.get("index", i), f"gpu {i} index"),
            name=str(g.get("name", "")),
            uuid=str(g.get("uuid", "")),
            memory_total_bytes=_int(g.get("memory_total"), f"gpu {i} memory_total"),
            memory_used_bytes=_int(g.get("memory_used"), f"gpu {i} memory_used"),
            processes=procs,
        ))
    driver = data.get("driver")
    return GpuFacts("nvml", tuple(gpus), str(driver) if driver else None)


def _csv_rows(text: str, fields: int, what: str) -> list[list[str]]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        # GPU names hold no commas; process names may: split the name field last
        parts = [p.strip() for p in line.split(",")]
        if len(parts) > fields:
            head, tail = parts[:2], parts[-1:]
            parts = [*head, ", ".join(parts[2:-1]), *tail]
        if len(parts) != fields:
            raise GpuParseError(f"{what} line {n}: expected {fields} fields, got {line!r}")
        rows.append(parts)
    return rows


def _mib(value: str, what: str) -> int | None:
    if value.startswith("[") or value in ("N/A", ""):  # "[N/A]", "[Not Supported]"
        return None
    try:
        return int(float(value) * MIB)
    except ValueError:
        raise GpuParseError(f"{what}: expected MiB, got {value!r}") from None


def parse_smi(gpus_csv: str, apps_csv: str | None) -> GpuFacts:
    """nvidia-smi's ``--format=csv,noheader,nounits`` output of the two queries above."""
    procs: dict[str, list[GpuProcess]] = {}
    for uuid, pid, name, used in _csv_rows(apps_csv or "", 4, "compute-apps"):
        procs.setdefault(uuid, []).append(
            GpuProcess(_int(pid, f"compute-apps pid {pid!r}"), _mib(used, f"pid {pid} memory"),
                       name or None))
    gpus = []
    for index, name, uuid, total, used in _csv_rows(gpus_csv, 5, "query-gpu"):
        total_b = _mib(total, f"GPU {index} memory.total")
        used_b = _mib(used, f"GPU {index} memory.used")
        gpus.append(Gpu(_int(index, "GPU index"), name, uuid, total_b or 0, used_b or 0,
                        tuple(procs.get(uuid, ()))))
    return GpuFacts("nvidia-smi", tuple(gpus))


def from_agent(raw: Mapping[str, Any] | None) -> GpuFacts:
    """Whatever the agent read: NVML first, nvidia-smi second, else no GPUs."""
    if not raw:
        return GpuFacts("none")
    error = raw.get("nvml_error")
    if raw.get("nvml") is not None:
        return parse_nvml(raw["nvml"])
    if raw.get("smi_gpus") is not None:
        found = parse_smi(raw["smi_gpus"], raw.get("smi_apps"))
        return GpuFacts(found.source, found.gpus, found.driver, error)
    return GpuFacts("none", error=raw.get("smi_error") or error)


def stale_processes(
    gpus: GpuFacts, service_pids: Iterable[int], cmdlines: Mapping[str, str | None]
) -> list[StaleProcess]:
    """Processes holding GPU memory that are not the service's own (a killed start's
    leftover workers): what ``--kill-stale`` ends."""
    ours = set(service_pids)
    found: dict[int, tuple[list[int], int | None]] = {}
    for gpu in gpus.gpus:
        for proc in gpu.processes:
            if proc.pid in ours:
                continue
            indexes, used = found.get(proc.pid, ([], 0))
            indexes.append(gpu.index)
            total = None if used is None or proc.used_bytes is None else used + proc.used_bytes
            found[proc.pid] = (indexes, total)
    return [StaleProcess(pid, tuple(idx), used, cmdlines.get(str(pid)))
            for pid, (idx, used) in sorted(found.items())]
