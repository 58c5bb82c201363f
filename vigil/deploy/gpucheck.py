"""Does the stack fit these GPUs, and are they healthy? (pure; preflight, before any write)

* architecture: each GPU's compute capability against the architectures the stack says
  its torch/flashinfer builds carry (``Stack.gpu_archs``); on the host, the installed
  torch's own ``torch.cuda.get_arch_list()`` when a new environment is verified;
* driver: the host's driver against the minimum driver of the stack's CUDA release
  (``MIN_DRIVER``, one table with its source);
* ``CUDA_VISIBLE_DEVICES`` naming GPUs the host does not have;
* health (policy: ``GpuPolicy``, from the preflight role's defaults): uncorrectable ECC
  errors, pending page retirement, row remaps or channel/TPC repairs, unrepairable
  memory, recent Xid events, persistence mode,
  MIG mode and the instances a CUDA process would see.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from vigil.deploy.gpus import GIB, Gpu, GpuFacts, XidEvent
from vigil.desired.config import HostVars
from vigil.desired.stacks import Stack
from vigil.errors import RefusedError

# Minimum Linux x86_64 driver of each CUDA release: NVIDIA CUDA Toolkit Release Notes,
# Table 3 "CUDA Toolkit and Corresponding Driver Versions" (the GA release's "Toolkit
# Driver Version"; docs.nvidia.com/cuda/cuda-toolkit-release-notes). Minor-version
# compatibility lets some 12.x builds start on an older 12.x driver, but PTX JIT (Triton,
# flashinfer JIT) then fails; vigil asks for the toolkit's own driver.
MIN_DRIVER: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
    "13.1": "590.44.01",
}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def newest_cuda(gpus: GpuFacts) -> str | None:
    """The newest CUDA the driver runs: as the driver said (NVML, XML), else the newest
    release of ``MIN_DRIVER`` the driver version reaches (nvidia-smi's CSV has no field
    for it); None when neither is known."""
    if gpus.cuda or not gpus.driver:
        return gpus.cuda
    reached = [c for c, need in MIN_DRIVER.items() if _version(gpus.driver) >= _version(need)]
    return max(reached, key=_version) if reached else None


@dataclass(frozen=True)
class GpuPolicy:
    """What GPU health a deploy refuses; the values come from the host's variables
    (roles/preflight/defaults.yml < group_vars < host < --set)."""

    refuse_ecc_uncorrected: bool = True
    refuse_pending_retirement: bool = True
    refuse_mig: bool = True
    require_persistence: bool = False
    refuse_xids: frozenset[int] = field(default_factory=lambda: frozenset(
        HostVars.model_fields["gpu_refuse_xids"].get_default(call_default_factory=True)))
    xid_window: timedelta = timedelta(hours=24)

    @classmethod
    def of(cls, v: HostVars) -> GpuPolicy:
        return cls(v.gpu_refuse_ecc_uncorrected, v.gpu_refuse_pending_retirement,
                   v.gpu_refuse_mig, v.gpu_require_persistence, frozenset(v.gpu_refuse_xids),
                   timedelta(hours=v.gpu_xid_window_h))


# -- architectures ----------------------------------------------------------------------


def _arch(text: str) -> tuple[str, int, str] | None:
    """'sm_90a' -> ('sm', 90, 'a'); 'compute_120' -> ('compute', 120, '')."""
    m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", text.strip())
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def runs_on(archs: Sequence[str], sm: str) -> bool:
    """Whether a build carrying ``archs`` has kernels for a GPU of architecture ``sm``:
    SASS (sm_XY) runs on the same major at an equal or higher minor; arch-specific SASS
    (sm_90a, sm_100f) only on that exact one; PTX (compute_XY) is JIT-compiled for any
    GPU at XY or above."""
    gpu = _arch(sm)
    if gpu is None:
        return True  # unknown capability: nothing to judge
    for a in filter(None, map(_arch, archs)):
        kind, number, suffix = a
        if kind == "compute" and number <= gpu[1]:
            return True
        if kind == "sm" and suffix and number == gpu[1]:
            return True
        if kind == "sm" and not suffix and number // 10 == gpu[1] // 10 and number <= gpu[1]:
            return True
    return False


def _ranges(indexes: Sequence[int]) -> str:
    """[0,1,2,3,5] -> '0..3,5'."""
    runs: list[list[int]] = []
    for i in sorted(set(indexes)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def _newest(archs: Sequence[str]) -> str:
    known = sorted(filter(None, map(_arch, archs)), key=lambda a: a[1])
    return f"sm_{known[-1][1]}{known[-1][2]}" if known else "nothing"


def arch_problems(host: str, stack: Stack, gpus: Sequence[Gpu],
                  archs: Mapping[str, Sequence[str]] | None = None,
                  where: str = "") -> list[RefusedError]:
    """GPUs a build has no kernels for ("no kernel image is available for execution on
    the device" at the first kernel). ``archs`` defaults to what the stack states."""
    out = []
    for package, listed in (archs if archs is not None else stack.gpu_archs).items():
        bad = [g for g in gpus if g.sm and not runs_on(listed, g.sm)]
        if not bad:
            continue
        sms = sorted({g.sm for g in bad if g.sm})
        version = stack.packages.get(package, "?")
        cuda = f", CUDA {stack.cuda}" if stack.cuda else ""
        out.append(RefusedError(
            f"{host}: GPU {_ranges([g.index for g in bad])} "
            f"{'is' if len(bad) == 1 else 'are'} {'/'.join(sms)} ({bad[0].name}); "
            f"{package} {version}{cuda}{where} has kernels up to {_newest(listed)} "
            f"({' '.join(listed)})",
            fix=f"pin a {package} build that carries {'/'.join(sms)} (for sm_100/sm_120: a "
                f"cu128+ build) in stacks/{stack.name}.yml of the inventory",
        ))
    return out


def driver_problems(host: str, stack: Stack, gpus: GpuFacts) -> list[RefusedError]:
    if not stack.cuda or not gpus.driver or not gpus.gpus:
        return []
    need = MIN_DRIVER.get(stack.cuda)
    if need is None:  # a release newer than the table: at least the newest known one
        older = [c for c in MIN_DRIVER if _version(c) <= _version(stack.cuda)]
        need = MIN_DRIVER[max(older, key=_version)] if older else None
    if need is None or _version(gpus.driver) >= _version(need):
        return []
    cuda = newest_cuda(gpus)
    newest = f" (its newest CUDA is {cuda})" if cuda else ""
    return [RefusedError(
        f"{host}: driver {gpus.driver}{newest} is older than {need}, the minimum for CUDA "
        f"{stack.cuda}, which stack {stack.name} is built for",
        fix=f"install NVIDIA driver {need} or newer on {host}, or pin a stack built for an "
            "older CUDA",
    )]


def visible_devices_problems(host: str, env: Mapping[str, str],
                             gpus: GpuFacts) -> list[RefusedError]:
    """An explicit CUDA_VISIBLE_DEVICES naming GPUs (indexes or UUIDs) the host lacks."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None or not gpus.gpus:
        return []
    uuids = {g.uuid for g in gpus.gpus} | {m.uuid for g in gpus.gpus for m in g.mig_devices
                                           if m.uuid}
    indexes = {str(g.index) for g in gpus.gpus}
    missing = [item.strip() for item in value.split(",") if item.strip()
               and item.strip() not in indexes
               and not any(u.startswith(item.strip()) for u in uuids if u)]
    if not missing:
        return []
    return [RefusedError(
        f"{host}: CUDA_VISIBLE_DEVICES={value} names {', '.join(missing)}, which the host "
        f"does not have (GPUs {_ranges([g.index for g in gpus.gpus])}"
        f"{', ' + ', '.join(g.uuid for g in gpus.gpus[:2]) + ', ...' if gpus.gpus else ''})",
        fix="set CUDA_VISIBLE_DEVICES to the host's GPU indexes or UUIDs, or remove it",
    )]


# -- health -----------------------------------------------------------------------------


def recent_xids(gpus: GpuFacts, window: timedelta) -> list[XidEvent]:
    """Xid events inside the window before the host's clock; an event without a time
    counts as recent (it cannot be shown old)."""
    out = []
    for e in gpus.xids:
        if e.time is None or gpus.now is None:
            out.append(e)
            continue
        now = gpus.now if e.time.tzinfo else gpus.now.replace(tzinfo=None)
        if now - e.time <= window:
            out.append(e)
    return out


def health_lines(gpus: GpuFacts, policy: GpuPolicy) -> list[str]:
    """What preflight shows of each GPU's health, whatever the policy refuses."""
    lines = []
    for g in gpus.gpus:
        bits = [f"{g.sm or 'sm ?'}"]
        for label, value in (("persistence", g.persistence), ("MIG", g.mig)):
            bits.append(f"{label} {'?' if value is None else 'on' if value else 'off'}")
        ecc = f"ECC uncorrected {'?' if g.ecc_uncorrected is None else g.ecc_uncorrected}"
        if g.ecc_uncorrected_aggregate and g.ecc_uncorrected_aggregate != g.ecc_uncorrected:
            ecc += f" ({g.ecc_uncorrected_aggregate} in the GPU's lifetime)"  # not refused
        bits.append(ecc)
        if g.unrepairable_memory:
            bits.append("unrepairable memory")
        bits.append("pending: " + (", ".join(g.pending) if g.pending else "none"))
        if g.mig_devices:
            bits.append(f"{len(g.mig_devices)} MIG instance(s): "
                        + ", ".join(_mig_name(m) for m in g.mig_devices))
        lines.append(f"GPU {g.index}: " + "; ".join(bits))
    if gpus.kernel_log is None:
        lines.append("Xid events: kernel log not read")
    else:
        recent = recent_xids(gpus, policy.xid_window)
        codes = sorted({e.code for e in recent})
        lines.append(f"Xid events in the last {policy.xid_window.total_seconds() / 3600:g} h "
                     f"({gpus.kernel_log}): {len(recent)}"
                     + (f" (Xid {', '.join(map(str, codes))})" if codes else ""))
    return lines


def _mig_name(m: Any) -> str:
    size = f" {m.memory_total_bytes / GIB:.0f} GiB" if m.memory_total_bytes else ""
    return f"{m.profile or 'MIG ' + str(m.index)}{size}"


def health_problems(host: str, gpus: GpuFacts, policy: GpuPolicy,
                    need: int) -> list[RefusedError]:
    out = []
    p = policy
    ecc = [g for g in gpus.gpus if g.ecc_uncorrected]
    if p.refuse_ecc_uncorrected and ecc:
        out.append(RefusedError(
            f"{host}: uncorrectable ECC errors since the driver loaded: "
            + ", ".join(f"GPU {g.index}: {g.ecc_uncorrected}" for g in ecc),
            fix="drain the host and reset the GPU (nvidia-smi -r -i N) or reboot; replace it "
                "if they return (gpu_refuse_ecc_uncorrected: false accepts it)",
        ))
    pending = [(g, what) for g in gpus.gpus
               for what in (*(f"{name} pending" for name in g.pending),
                            *(("row remap failed",) if g.remap_failure else ()))]
    if p.refuse_pending_retirement and pending:
        out.append(RefusedError(
            f"{host}: " + "; ".join(f"GPU {g.index}: {w}" for g, w in pending),
            fix="drain the host, then reset the GPU (nvidia-smi -r -i N) or reboot so the "
                "retirement/remap/repair takes effect; a failed remap means the GPU needs "
                "replacing (gpu_refuse_pending_retirement: false accepts it)",
        ))
    # the GPU says its memory can no longer be repaired: a reset does not help
    broken = [g for g in gpus.gpus if g.unrepairable_memory]
    if p.refuse_pending_retirement and broken:
        out.append(RefusedError(
            f"{host}: " + "; ".join(f"GPU {g.index}: unrepairable memory (nvidia-smi "
                                    "-q: Unrepairable Memory: Yes)" for g in broken),
            fix="drain the host and replace the GPU (RMA); a reset does not clear it",
        ))
    mig = [g for g in gpus.gpus if g.mig]
    if p.refuse_mig and mig:
        seen = ", ".join(f"GPU {g.index}: {len(g.mig_devices)} instance(s)"
                         + (f" ({', '.join(_mig_name(m) for m in g.mig_devices)})"
                            if g.mig_devices else "") for g in mig)
        out.append(RefusedError(
            f"{host}: MIG is enabled ({seen}); a CUDA process sees one MIG instance, not the "
            f"whole GPU, and vLLM cannot spread {need} GPU(s) of tensor/pipeline parallelism "
            "over MIG instances",
            fix="disable MIG (nvidia-smi -i N -mig 0, then reset the GPU), or for a "
                "one-GPU profile set CUDA_VISIBLE_DEVICES to one MIG UUID and "
                "gpu_refuse_mig: false",
        ))
    off = [g for g in gpus.gpus if g.persistence is False]
    if p.require_persistence and off:
        out.append(RefusedError(
            f"{host}: persistence mode is off on GPU {_ranges([g.index for g in off])}",
            fix="enable it (nvidia-smi -pm 1, or the nvidia-persistenced service)",
        ))
    bad = [e for e in recent_xids(gpus, p.xid_window) if e.code in p.refuse_xids]
    if bad:
        shown = "\n    ".join(e.line for e in bad[-5:])
        more = f"\n    ({len(bad) - 5} more)" if len(bad) > 5 else ""
        out.append(RefusedError(
            f"{host}: {len(bad)} Xid event(s) in the last "
            f"{p.xid_window.total_seconds() / 3600:g} h ({gpus.kernel_log}) that leave a GPU "
            f"unusable until reset:\n    {shown}{more}",
            fix="check the GPU named by its PCI address (nvidia-smi -q), reset it or reboot "
                "the host, then deploy; gpu_refuse_xids lists the codes refused",
        ))
    return out


def problems(host: str, stack: Stack, env: Mapping[str, str], gpus: GpuFacts,
             policy: GpuPolicy, need: int) -> list[RefusedError]:
    """Every GPU refusal, in the order a start would meet them."""
    return (visible_devices_problems(host, env, gpus) + driver_problems(host, stack, gpus)
            + arch_problems(host, stack, list(gpus.gpus))
            + health_problems(host, gpus, policy, need))


def installed_arch_problems(stack: Stack, reply: Mapping[str, Any]) -> list[str]:
    """A freshly built environment's torch, asked on the host (the install reply's
    ``torch_cuda``: ``torch.cuda.get_arch_list()`` and the visible GPUs' capabilities):
    GPUs its kernels do not cover, and architectures the stack claims but it lacks. A CPU
    build or a host without a usable GPU says nothing, and nothing is judged."""
    found = reply.get("torch_cuda")
    if not isinstance(found, dict) or not found.get("available"):
        return []
    archs = [str(a) for a in found.get("archs") or []]
    version = stack.packages.get("torch", "?")
    out = []
    for cc in found.get("capabilities") or []:
        sm = f"sm_{cc[0]}{cc[1]}"
        if not runs_on(archs, sm):
            out.append(f"torch {version} (CUDA {found.get('cuda')}) has no kernels for this "
                       f"host's {sm} GPUs: its arch list is {' '.join(archs)}")
            break
    claimed = stack.gpu_archs.get("torch", [])
    lacking = [a for a in claimed if a not in archs]
    if lacking:
        out.append(f"torch {version} lacks {', '.join(lacking)}, which stack {stack.name} "
                   f"states in gpu_archs (installed: {' '.join(archs)})")
    return out
