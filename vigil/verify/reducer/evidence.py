"""Progress evidence between two snapshots: CPU time, GPU memory, RSS, checkpoint
shards, the compile cache; and which of it counts in a phase.
"""

from __future__ import annotations

from vigil.verify import catalog
from vigil.verify.reducer.state import (
    CPU_BUSY,
    MAX_STRETCH,
    MOVE_MIB,
    RSS_MOVE,
    STARVED,
    Baseline,
    Evidence,
)
from vigil.verify.snapshot import Snapshot


def _baseline(snap: Snapshot) -> Baseline:
    procs = snap.processes
    cpu: dict[int, float] | None = None
    alive: bool | None = None
    runnable: bool | None = None
    rss: int | None = None
    if procs is not None and procs.error is None:
        cpu = {p.pid: p.cpu_s for p in procs.items}
        alive = any(p.state not in ("Z", "X", "x") for p in procs.items)
        runnable = any(p.state == "R" for p in procs.items)
        rss = procs.rss_bytes
    gpus = snap.gpus
    gpu = None
    if gpus is not None and gpus.error is None and gpus.devices:
        gpu = {g.index: g.memory_used_mib for g in gpus.devices}
    cache = snap.cache
    readable = cache is not None and cache.readable
    return Baseline(
        time=snap.time,
        cpu_by_pid=cpu,
        alive=alive,
        rss_bytes=rss,
        gpu_mib=gpu,
        gpu_source=gpus.source if gpus is not None else "",
        cache_bytes=cache.bytes if cache is not None and readable else None,
        cache_files=cache.files if cache is not None and readable else None,
        cache_newest=cache.newest_mtime if cache is not None and readable else None,
        cpu_load=snap.cpu_load if snap.cpu_load is not None and snap.cpu_load.error is None
        else None,
        runnable=runnable,
    )


def _cpu_delta(a: Baseline, b: Baseline) -> float | None:
    if a.cpu_by_pid is None or b.cpu_by_pid is None:
        return None
    # Processes that appeared since count with all their CPU; the ones that left count 0.
    return sum(max(cpu - a.cpu_by_pid.get(pid, 0.0), 0.0) for pid, cpu in b.cpu_by_pid.items())


def _gpu_delta(a: Baseline, b: Baseline) -> float | None:
    if a.gpu_mib is None or b.gpu_mib is None or a.gpu_source != b.gpu_source:
        return None
    keys = set(a.gpu_mib) | set(b.gpu_mib)
    return sum(abs(b.gpu_mib.get(k, 0.0) - a.gpu_mib.get(k, 0.0)) for k in keys)


def _diff(a: Baseline, b: Baseline) -> Evidence:
    wall = max(b.time - a.time, 0.0)
    cpu = _cpu_delta(a, b)
    newer = (
        b.cache_newest is not None
        and (a.cache_newest is None or b.cache_newest > a.cache_newest)
    )
    return Evidence(
        wall_s=wall,
        cpu_ratio=(cpu / wall) if cpu is not None and wall > 0 else None,
        gpu_delta_mib=_gpu_delta(a, b),
        cache_delta_files=(
            b.cache_files - a.cache_files
            if a.cache_files is not None and b.cache_files is not None else None
        ),
        cache_delta_bytes=(
            b.cache_bytes - a.cache_bytes
            if a.cache_bytes is not None and b.cache_bytes is not None else None
        ),
        cache_newer=newer,
        rss_delta_bytes=(
            b.rss_bytes - a.rss_bytes
            if a.rss_bytes is not None and b.rss_bytes is not None else None
        ),
    )


def _progress(phase: str, ev: Evidence, base: Baseline) -> tuple[str, ...]:
    seen: list[str] = []
    if ev.new_lines:
        seen.append("log")
    if ev.shard_moved:
        seen.append("shards")
    if ev.gpu_delta_mib is not None and ev.gpu_delta_mib >= MOVE_MIB:
        seen.append("gpu memory")
    cache_grew = bool(
        (ev.cache_delta_files or 0) > 0 or (ev.cache_delta_bytes or 0) > 0 or ev.cache_newer
    )
    if cache_grew:
        seen.append("compile cache")
    if ev.rss_delta_bytes is not None and abs(ev.rss_delta_bytes) >= RSS_MOVE:
        seen.append("rss")
    rec = catalog.PHASE[phase]
    busy = ev.cpu_ratio is not None and ev.cpu_ratio >= CPU_BUSY
    if busy:
        # CPU counts where it is the work, or where none of the phase's own signals can
        # be observed (no GPUs, no readable cache): then it is the best evidence left.
        observable = {"gpu memory": base.gpu_mib is not None,
                      "rss": base.rss_bytes is not None,
                      "compile cache": base.cache_files is not None}
        own_missing = bool(rec.own_signals) and not any(
            observable.get(sig, True) for sig in rec.own_signals)
        if "cpu" in rec.progress or own_missing:
            seen.append("cpu")
    return tuple(sig for sig in seen if sig in rec.progress or sig == "cpu")


def _delta(a: int | None, b: int | None) -> int | None:
    return b - a if a is not None and b is not None and b >= a else None


# CPU seconds per wall second a tree must have used to be one the host holds back: a
# frozen or sleeping vLLM tree uses next to none (its API server idles)
RAN = 0.02


def _ran(a: Baseline, b: Baseline, wall: float) -> bool:
    cpu = _cpu_delta(a, b)
    return (cpu is not None and cpu >= RAN * wall) or bool(b.runnable)


def starvation(a: Baseline | None, b: Baseline) -> tuple[float, str, float] | None:
    """How much of the time between two polls the host kept the tree from the CPU, when
    it is at least STARVED: (share, what says so, seconds). The unit's own counters come
    first: its quota's throttled periods (cgroup cpu.stat, v1 or v2), then its tasks'
    CPU pressure (cpu.pressure, else the host's /proc/pressure/cpu when the tree ran in
    that time or is runnable now); and the hypervisor's steal (/proc/stat). A hung tree
    runs nothing, so it is neither throttled nor under pressure of its own."""
    if a is None or a.cpu_load is None or b.cpu_load is None:
        return None
    wall = b.time - a.time
    if wall <= 0:
        return None
    x, y = a.cpu_load, b.cpu_load
    seen: list[tuple[float, str]] = []
    periods = _delta(x.nr_periods, y.nr_periods)
    throttled = _delta(x.nr_throttled, y.nr_throttled)
    if periods and throttled is not None:
        seen.append((throttled / periods, "throttled"))
    elif (us := _delta(x.throttled_us, y.throttled_us)) is not None and us > 0:
        seen.append((us / (wall * 1e6), "throttled"))
    own = _delta(x.pressure_some_us, y.pressure_some_us)
    if own is not None:
        seen.append((own / (wall * 1e6), "waiting for a CPU"))
    elif _ran(a, b, wall) and (host := _delta(x.host_pressure_some_us,
                                              y.host_pressure_some_us)) is not None:
        # the host's pressure says the tree is starved only when the tree ran in that
        # time (it wants the CPU and gets some): a frozen (SIGSTOP) or sleeping tree on a
        # busy host is stuck, not held back
        seen.append((host / (wall * 1e6), "the host's tasks waiting for a CPU"))
    steal, total = _delta(x.steal_ticks, y.steal_ticks), _delta(x.total_ticks, y.total_ticks)
    if steal is not None and total:
        seen.append((steal / total, "CPU stolen by the hypervisor"))
    if not seen:
        return None
    share, what = max(seen)
    share = min(max(share, 0.0), 1.0)
    return (share, what, wall) if share >= STARVED else None


def stretched(window: float, share: float) -> float:
    """The stall window for a tree that got (1 - share) of the CPU it waited for."""
    return window * min(1.0 / max(1.0 - share, 1e-9), MAX_STRETCH)


def starved_line(share: float, what: str, wall: float) -> str:
    return f"starved: {what} {share * 100:.0f} % of the last {wall:.0f} s"
