"""GPUs as the host reports them (pure parsers), who holds their memory, and their health.

The agent prints raw readings (``agent.gpu_facts``); every parser here reads the tool's own
output unchanged (tests/fixtures/gpus holds published real outputs, each with its source):

* NVML through the environment's python (``nvidia-ml-py``): memory, processes, compute
  capability, the driver's CUDA version, and health (uncorrected ECC, retired pages
  pending, remapped rows, repair status, unrepairable memory), each read on its own;
* ``nvidia-smi --query-gpu=<fields> --format=csv`` and ``--query-compute-apps=...``: read by
  their header, so any field subset and order parses, with or without units (``81559 MiB``)
  and with ``[N/A]`` / ``[Not Supported]`` where the driver does not say;
* ``nvidia-smi -q -x`` (XML): health where an old driver rejects the CSV health fields;
* ``nvidia-smi -L``: the MIG instances a CUDA process can be given;
* the kernel log's ``NVRM: Xid (PCI:...): N, ...`` lines (journalctl -k or dmesg).

A CPU host has none of them: ``source == "none"`` and no GPUs.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

MIB = 2**20
GIB = 2**30


class GpuParseError(ValueError):
    """The host printed something that is not the documented format."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: the driver does not say ("[N/A]": WDDM, some containers)
    name: str | None = None


@dataclass(frozen=True)
class MigDevice:
    gpu: int
    index: int
    profile: str | None = None  # "3g.40gb" (nvidia-smi -L); the XML does not name it
    uuid: str | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    processes: tuple[GpuProcess, ...] = ()
    # None everywhere below: the reading did not say (older driver, consumer card, a read
    # NVML does not support and nvidia-smi did not fill)
    compute_cap: str | None = None  # "9.0", "12.0"
    bus_id: str | None = None  # "00000000:00:09.0"
    persistence: bool | None = None
    mig: bool | None = None  # MIG mode, current
    ecc_uncorrected: int | None = None  # volatile (since the driver loaded)
    ecc_uncorrected_aggregate: int | None = None  # the GPU's lifetime (shown, not refused)
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    # Blackwell memory repair (nvidia-smi -q -x schema v13, <ecc_errors>; NVML
    # nvmlDeviceGetRepairStatus -> nvmlRepairStatus_v1_t.bChannelRepairPending /
    # bTpcRepairPending, nvmlDeviceGetUnrepairableMemoryFlag_v1 -> bUnrepairableMemory:
    # NVML API Reference R590, docs.nvidia.com/deploy/nvml-api). NVIDIA's "GPU Memory Error
    # Management" note (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt) lists "RAS Repair -
    # GPU Memory" for GB10x: a third remap on a bank invokes HBM channel repair when a spare
    # channel is left. Neither says when a pending repair applies; vigil reads "pending" as
    # the row remapper's own pending flag (applied at the next GPU reset).
    channel_repair_pending: bool | None = None
    tpc_repair_pending: bool | None = None
    unrepairable_memory: bool | None = None  # True: no spare left; the GPU needs replacing
    mig_devices: tuple[MigDevice, ...] = ()

    @property
    def pending(self) -> tuple[str, ...]:
        """What waits for a GPU reset: retired pages, row remaps, Blackwell repairs."""
        return tuple(name for name, v in (("retired pages", self.retired_pages_pending),
                                          ("row remap", self.remap_pending),
                                          ("channel repair", self.channel_repair_pending),
                                          ("TPC repair", self.tpc_repair_pending)) if v)

    @property
    def sm(self) -> str | None:
        """The CUDA architecture name of the compute capability: 9.0 -> sm_90."""
        if not self.compute_cap or not re.fullmatch(r"\d+\.\d+", self.compute_cap):
            return None
        major, minor = self.compute_cap.split(".")
        return f"sm_{major}{minor}"


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid`` line of the kernel log: the driver's report of a GPU error."""

    pci: str  # as the driver prints it: "0000:cb:00"
    code: int
    line: str
    time: datetime | None = None  # None: the line carried no absolute time
    gpu: int | None = None  # the GPU index with that PCI address, when known


@dataclass(frozen=True)
class GpuFacts:
    source: str  # "nvml" | "nvidia-smi" | "nvidia-smi-xml" | "none"
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    error: str | None = None  # why NVML was not used, when it was not
    cuda: str | None = None  # the newest CUDA the driver supports ("12.8"), when read
    xids: tuple[XidEvent, ...] = ()
    kernel_log: str | None = None  # where the Xid lines came from; None: not read
    now: datetime | None = None  # the host's clock when it read the kernel log

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


# -- values -----------------------------------------------------------------------------


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise GpuParseError(f"{what}: expected a number, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise GpuParseError(f"{what}: expected a number, got {value!r}") from None


def _absent(value: str | None) -> bool:
    # "[N/A]", "[Not Supported]", "[Requested functionality has been deprecated]", "N/A"
    return value is None or value.strip() in ("", "N/A", "None") or value.strip().startswith("[")


def _text(value: str | None) -> str | None:
    return None if _absent(value) else str(value).strip()


def _mib(value: str | None, what: str) -> int | None:
    """'81559 MiB' or '81559' (MiB) as bytes."""
    if _absent(value):
        return None
    number = str(value).strip().removesuffix("MiB").strip()
    try:
        return int(float(number) * MIB)
    except ValueError:
        raise GpuParseError(f"{what}: expected MiB, got {value!r}") from None


def _count(value: str | None, what: str) -> int | None:
    if _absent(value):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise GpuParseError(f"{what}: expected a count, got {value!r}") from None


def _flag(value: str | None) -> bool | None:
    text = _text(value)
    if text is None:
        return None
    low = text.lower()
    if low in ("enabled", "yes", "on", "true"):
        return True
    if low in ("disabled", "no", "off", "false"):
        return False
    return None


# -- nvidia-smi CSV --------------------------------------------------------------------


def parse_query_csv(text: str, what: str) -> list[dict[str, str]]:
    """``--format=csv`` output as one dict per row, keyed by the header's field names
    (units such as `` [MiB]`` dropped). Field values never hold ", " except a process
    name, which takes any surplus."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    head = [re.sub(r"\s*\[[^\]]*\]$", "", h.strip()) for h in lines[0].split(",")]
    if not head or any(not re.fullmatch(r"[A-Za-z0-9_.]+", h) for h in head):
        raise GpuParseError(f"{what}: first line is not a CSV header: {lines[0][:200]!r}")
    name_col = next((i for i, h in enumerate(head) if h in ("process_name", "name")), None)
    rows = []
    for n, line in enumerate(lines[1:], 2):
        values = [v.strip() for v in line.split(", ")]
        extra = len(values) - len(head)
        if extra > 0 and name_col is not None:
            end = name_col + extra + 1
            values[name_col:end] = [", ".join(values[name_col:end])]
        if len(values) != len(head):
            raise GpuParseError(f"{what} line {n}: expected {len(head)} fields, got {line[:200]!r}")
        rows.append(dict(zip(head, values, strict=True)))
    return rows


def _pick(row: Mapping[str, str], *names: str) -> str | None:
    return next((row[n] for n in names if n in row), None)


def parse_smi(gpus_csv: str, apps_csv: str | None = None, mig_list: str | None = None) -> GpuFacts:
    """``nvidia-smi --query-gpu`` and ``--query-compute-apps`` (``--format=csv``)."""
    procs: dict[str, list[GpuProcess]] = {}
    for row in parse_query_csv(apps_csv or "", "compute-apps"):
        pid = _pick(row, "pid")
        uuid = _pick(row, "gpu_uuid") or ""
        procs.setdefault(uuid, []).append(GpuProcess(
            _int(pid, f"compute-apps pid {pid!r}"),
            _mib(_pick(row, "used_gpu_memory", "used_memory"), f"pid {pid} memory"),
            _text(_pick(row, "process_name", "name"))))
    gpus = []
    driver = None
    for n, row in enumerate(parse_query_csv(gpus_csv, "query-gpu")):
        # without an index field, rows come in nvidia-smi's own order
        index = _int(_pick(row, "index") or n, "query-gpu index")
        uuid = _pick(row, "uuid", "gpu_uuid") or ""
        driver = driver or _text(_pick(row, "driver_version"))
        gpus.append(Gpu(
            index=index,
            name=_pick(row, "name", "gpu_name") or "",
            uuid=uuid,
            memory_total_bytes=_mib(_pick(row, "memory.total"), f"GPU {index} memory.total") or 0,
            memory_used_bytes=_mib(_pick(row, "memory.used"), f"GPU {index} memory.used") or 0,
            processes=tuple(procs.get(uuid, ())),
            compute_cap=_text(_pick(row, "compute_cap")),
            bus_id=_text(_pick(row, "pci.bus_id", "gpu_bus_id")),
            persistence=_flag(_pick(row, "persistence_mode")),
            mig=_flag(_pick(row, "mig.mode.current")),
            ecc_uncorrected=_count(_pick(row, "ecc.errors.uncorrected.volatile.total"),
                                   f"GPU {index} ecc.errors.uncorrected.volatile.total"),
            retired_pages_pending=_flag(_pick(row, "retired_pages.pending")),
            remap_pending=_flag(_pick(row, "remapped_rows.pending")),
            remap_failure=_flag(_pick(row, "remapped_rows.failure")),
        ))
    facts = GpuFacts("nvidia-smi", tuple(gpus), driver)
    return with_mig_list(facts, mig_list) if mig_list else facts


# -- nvidia-smi -L (MIG instances) ------------------------------------------------------

_LIST_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: ([^)]*)\)")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]*)\)")


def parse_mig_list(text: str) -> dict[int, tuple[MigDevice, ...]]:
    """``nvidia-smi -L``: each GPU line, then its MIG devices indented under it."""
    found: dict[int, list[MigDevice]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        if m := _LIST_GPU.match(line):
            gpu = int(m.group(1))
            found.setdefault(gpu, [])
        elif (m := _LIST_MIG.match(line)) and gpu is not None:
            found[gpu].append(MigDevice(gpu, int(m.group(2)), m.group(1), m.group(3)))
    return {g: tuple(devs) for g, devs in found.items()}


def with_mig_list(facts: GpuFacts, text: str) -> GpuFacts:
    listed = parse_mig_list(text)
    return replace(facts, gpus=tuple(
        replace(g, mig_devices=listed[g.index]) if listed.get(g.index) else g
        for g in facts.gpus))


# -- nvidia-smi -q -x -------------------------------------------------------------------


def _find(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    return None if found is None or found.text is None else found.text.strip()


def _xml_uncorrected(node: ET.Element, counter: str) -> int | None:
    """Uncorrectable ECC errors of one counter ("volatile" or "aggregate"): the sum of the
    DRAM and SRAM fields the schema has (v12+), else the older ``total/uncorr``."""
    unc = [_count(_find(node, f"ecc_errors/{counter}/{k}"), k)
           for k in ("dram_uncorrectable", "sram_uncorrectable",
                     "sram_uncorrectable_parity", "sram_uncorrectable_secded")]
    known = [u for u in unc if u is not None]
    if not known:
        total = _count(_find(node, f"ecc_errors/{counter}/total/uncorr"), "uncorr")
        known = [total] if total is not None else []
    return sum(known) if known else None


def parse_smi_xml(text: str) -> GpuFacts:
    """``nvidia-smi -q -x``: identity, memory, processes, and the health fields (ECC,
    retired pages, remapped rows, Blackwell channel/TPC repair and unrepairable memory,
    persistence, MIG mode and devices)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise GpuParseError(f"nvidia-smi -q -x: not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise GpuParseError(f"nvidia-smi -q -x: root is <{root.tag}>, not <nvidia_smi_log>")
    gpus = []
    for i, node in enumerate(root.findall("gpu")):
        index = i  # nvidia-smi's order (PCI bus); minor_number names the device node only
        migs = tuple(
            MigDevice(index, _count(_find(m, "index"), "mig index") or 0,
                      memory_total_bytes=_mib(_find(m, "fb_memory_usage/total"), "mig memory"))
            for m in node.findall("mig_devices/mig_device"))
        procs = tuple(
            GpuProcess(_int(_find(p, "pid"), "process pid"),
                       _mib(_find(p, "used_memory"), "process memory"),
                       _text(_find(p, "process_name")))
            for p in node.findall("processes/process_info"))
        gpus.append(Gpu(
            index=index,
            name=_find(node, "product_name") or "",
            uuid=_find(node, "uuid") or "",
            memory_total_bytes=_mib(_find(node, "fb_memory_usage/total"), "memory total") or 0,
            memory_used_bytes=_mib(_find(node, "fb_memory_usage/used"), "memory used") or 0,
            processes=procs,
            bus_id=node.get("id"),
            persistence=_flag(_find(node, "persistence_mode")),
            mig=_flag(_find(node, "mig_mode/current_mig")),
            ecc_uncorrected=_xml_uncorrected(node, "volatile"),
            ecc_uncorrected_aggregate=_xml_uncorrected(node, "aggregate"),
            retired_pages_pending=_flag(_find(node, "retired_pages/pending_retirement")),
            remap_pending=_flag(_find(node, "remapped_rows/remapped_row_pending")),
            remap_failure=_flag(_find(node, "remapped_rows/remapped_row_failure")),
            channel_repair_pending=_flag(_find(node, "ecc_errors/channel_repair_pending")),
            tpc_repair_pending=_flag(_find(node, "ecc_errors/tpc_repair_pending")),
            unrepairable_memory=_flag(_find(node, "ecc_errors/unrepairable_memory")),
            mig_devices=migs,
        ))
    return GpuFacts("nvidia-smi-xml", tuple(gpus), _text(_find(root, "driver_version")),
                    cuda=_text(_find(root, "cuda_version")))


# -- kernel log -------------------------------------------------------------------------

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")
# newer drivers say it without an Xid, over three lines (NVIDIA/NVSentinel#155)
_FALLEN = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f:.]+)\s*$")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[.,]\d+)?([+-]\d\d:?\d\d|Z)?")
_CTIME = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
XID_FALLEN_OFF_BUS = 79


def _line_time(line: str) -> datetime | None:
    """ISO (``journalctl -o short-iso``, ``dmesg --time-format iso``) or ctime
    (``dmesg --ctime``, local time without a zone); None for seconds since boot."""
    if m := _ISO.match(line):
        zone = (m.group(2) or "+00:00").replace("Z", "+00:00")
        if ":" not in zone:
            zone = zone[:3] + ":" + zone[3:]
        try:
            return datetime.fromisoformat(m.group(1) + zone)
        except ValueError:
            return None
    if m := _CTIME.match(line):
        try:
            return datetime.strptime(re.sub(r" +", " ", m.group(1)), "%a %b %d %H:%M:%S %Y")
        except ValueError:
            return None
    return None


def _pci_key(address: str) -> str:
    """'0000:cb:00' (kernel log) and '00000000:CB:00.0' (nvidia-smi) as one key."""
    parts = address.lower().split(".")[0].split(":")
    return ":".join(p.lstrip("0") or "0" for p in parts[-3:])


def parse_xids(text: str, gpus: Iterable[Gpu] = ()) -> tuple[XidEvent, ...]:
    """Every ``NVRM: Xid`` line (and the Xid-less "fallen off the bus" message, as Xid
    79), with its time when the line carries one and its GPU when a PCI bus id matches."""
    by_pci = {_pci_key(g.bus_id): g.index for g in gpus if g.bus_id}
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if m := _XID.search(line):
            pci, code = m.group(1), int(m.group(2))
        elif (m := _FALLEN.search(line)) and "fallen off the bus" in " ".join(lines[i:i + 3]):
            pci, code = m.group(1), XID_FALLEN_OFF_BUS
        else:
            continue
        out.append(XidEvent(pci, code, line.strip(), _line_time(line),
                            by_pci.get(_pci_key(pci))))
    return tuple(out)


# -- NVML (the agent's own JSON) ---------------------------------------------------------

# agent.nvml_health's keys: (reading, how many numbers it returns)
_NVML_HEALTH = {"ecc_uncorrected_volatile": 1, "ecc_uncorrected_aggregate": 1,
                "retired_pages_pending": 1, "remapped_rows": 4, "repair_status": 2,
                "unrepairable_memory": 1}


def _nvml_health(health: object, what: str) -> dict[str, Any]:
    """The agent's per-GPU NVML health reads as ``Gpu`` fields. A read the GPU, driver or
    nvidia-ml-py does not support (``{"not_supported": ...}``) or that failed
    (``{"error": ...}``) gives no field: unknown, for nvidia-smi to fill, never healthy."""
    if health is None:
        return {}
    if not isinstance(health, Mapping):
        raise GpuParseError(f"{what}: expected a mapping, got {str(health)[:200]!r}")
    got: dict[str, list[int]] = {}
    for key, size in _NVML_HEALTH.items():
        value = health.get(key)
        if value is None or (isinstance(value, Mapping)
                             and ({"not_supported", "error"} & value.keys())):
            continue
        numbers = value if isinstance(value, list) else [value]
        if len(numbers) != size:
            raise GpuParseError(f"{what} {key}: expected {size} number(s), got {value!r}")
        got[key] = [_int(v, f"{what} {key}") for v in numbers]
    out: dict[str, Any] = {}
    if "ecc_uncorrected_volatile" in got:
        out["ecc_uncorrected"] = got["ecc_uncorrected_volatile"][0]
    if "ecc_uncorrected_aggregate" in got:
        out["ecc_uncorrected_aggregate"] = got["ecc_uncorrected_aggregate"][0]
    if "retired_pages_pending" in got:  # nvmlEnableState_t
        out["retired_pages_pending"] = bool(got["retired_pages_pending"][0])
    if "remapped_rows" in got:  # corrected rows, uncorrected rows, pending, failure
        out["remap_pending"] = bool(got["remapped_rows"][2])
        out["remap_failure"] = bool(got["remapped_rows"][3])
    if "repair_status" in got:  # bChannelRepairPending, bTpcRepairPending
        out["channel_repair_pending"] = bool(got["repair_status"][0])
        out["tpc_repair_pending"] = bool(got["repair_status"][1])
    if "unrepairable_memory" in got:
        out["unrepairable_memory"] = bool(got["unrepairable_memory"][0])
    return out



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
        cc = g.get("cc")
        gpus.append(Gpu(
            index=_int(g.get("index", i), f"gpu {i} index"),
            name=str(g.get("name", "")),
            uuid=str(g.get("uuid", "")),
            memory_total_bytes=_int(g.get("memory_total"), f"gpu {i} memory_total"),
            memory_used_bytes=_int(g.get("memory_used"), f"gpu {i} memory_used"),
            processes=procs,
            compute_cap=(f"{_int(cc[0], 'cc')}.{_int(cc[1], 'cc')}"
                         if isinstance(cc, list) and len(cc) == 2 else None),
            **_nvml_health(g.get("health"), f"gpu {i} NVML health"),
        ))
    driver = data.get("driver")
    cuda = data.get("cuda_driver")  # nvmlSystemGetCudaDriverVersion: 12080 -> "12.8"
    cuda_text = (f"{_int(cuda, 'cuda_driver') // 1000}.{_int(cuda, 'cuda_driver') % 1000 // 10}"
                 if cuda is not None else None)
    return GpuFacts("nvml", tuple(gpus), str(driver) if driver else None, cuda=cuda_text)


# -- the agent's whole reading ---------------------------------------------------------


def _enrich(base: GpuFacts, more: GpuFacts) -> GpuFacts:
    """Fill what ``base`` does not know from ``more`` (matched by UUID, else by index)."""
    by_uuid = {g.uuid: g for g in more.gpus if g.uuid}
    by_index = {g.index: g for g in more.gpus}
    gpus = []
    for g in base.gpus:
        other = by_uuid.get(g.uuid) if g.uuid in by_uuid else by_index.get(g.index)
        if other is None:
            gpus.append(g)
            continue
        fill = {f.name: getattr(other, f.name) for f in fields(Gpu)
                if getattr(g, f.name) in (None, ()) and getattr(other, f.name) not in (None, ())}
        gpus.append(replace(g, **fill))
    return replace(base, gpus=tuple(gpus), driver=base.driver or more.driver,
                   cuda=base.cuda or more.cuda)


def from_agent(raw: Mapping[str, Any] | None) -> GpuFacts:
    """Whatever the agent read: NVML first (memory, processes, health), nvidia-smi's CSV
    and XML for what NVML did not give (a health read it could not make included), ``-L``
    for MIG devices, the kernel log for Xid events."""
    if not raw:
        return GpuFacts("none")
    error = raw.get("nvml_error")
    facts: GpuFacts | None = None
    if raw.get("nvml") is not None:
        facts = parse_nvml(raw["nvml"])
    if raw.get("smi_gpus") is not None:
        smi = parse_smi(raw["smi_gpus"], raw.get("smi_apps"))
        facts = _enrich(facts, smi) if facts is not None else replace(smi, error=error)
    if raw.get("smi_xml") is not None:
        xml = parse_smi_xml(raw["smi_xml"])
        facts = _enrich(facts, xml) if facts is not None else replace(xml, error=error)
    if facts is None:
        return GpuFacts("none", error=raw.get("smi_error") or error)
    if raw.get("smi_list"):
        facts = with_mig_list(facts, raw["smi_list"])
    if raw.get("kernel") is not None:
        try:
            now = datetime.fromisoformat(str(raw.get("now")))
        except ValueError:
            now = None
        facts = replace(facts, xids=parse_xids(raw["kernel"], facts.gpus),
                        kernel_log=str(raw.get("kernel_source") or "kernel log"), now=now)
    return facts


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
