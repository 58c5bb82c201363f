"""The pure reducer: fold probe snapshots into phase, progress evidence and a verdict.

`step(state, snapshot, budgets, smoke)` is clock-free (time comes from the snapshot)
and does no I/O, so a recorded trace replays through it at any speed.

What counts as progress (resets the phase's stall clock), per phase:

- everywhere: a new non-noise log line, a new phase, checkpoint-shard progress,
  GPU memory moving (>= 64 MiB), the compile cache growing (bytes, files or a newer
  write), the process tree's RSS moving (>= 64 MiB). These are work that a hung
  process cannot fake.
- CPU time (tree CPU >= 0.3x wall) counts only where CPU work *is* the work and
  nothing else has to move: bootstrap, engine_init, kv_cache (profile run),
  capturing_graphs, api_starting. It does NOT count in distributed_init (NCCL
  busy-polls at 100 % while hung), loading_weights (I/O bound: GPU memory or RSS must
  move) or compiling (inductor writes its cache as it goes: busy CPUs with a flat cache
  are spinning, not compiling) — unless that phase's own signal cannot be observed
  (no GPUs/cache readable), where CPU is the best evidence left.
- the 60-s "No available shared memory broadcast block" line proves the process is
  alive, never progress by itself.

Which signals count in which phase, each phase's stall window and hint: the `Phase`
records in the catalog (vigil/verify/catalog/).

Stalled needs a live process tree observed (state R/S/D/T, not all zombies): a plain
log without process data can never prove a stall. A quiet tree the host starves is held
back, not stuck: when the probe's counters (the unit's cgroup cpu.stat throttling, its
cpu.pressure or the host's /proc/pressure/cpu, /proc/stat's steal) show it kept from the
CPU for at least STARVED of the quiet time, the stall window stretches to W / (1 - share)
(at most MAX_STRETCH x) and the verdict line says so ("starved: throttled 62 % of the
last 30 s"). After a phase's end marker and
before the next phase's first marker, the time counts against the next phase.

Verdicts: ready, crashed, stalled, timed_out, stopped (terminal); slow (past its budget,
still progressing; watching goes on). The root of a crash is the earliest known root
cause, else the earliest exception line (`Type: message`), else a symptom (the engine
died), else a chain line (`… failed to start`); fatal lines after an orderly stop are
teardown and never a cause. Budgets never overrule evidence: a start past its budget
that keeps progressing is `slow`; `timed_out` needs the hard cap, or a phase past
TIMEOUT_FACTOR x a budget learned from history. Replay of a plain log decides ready when
the serving evidence appears; a later fatal line revokes it (crashed), a later orderly
stop is noted (ready, then stopped); budgets only annotate.

One module each: the state and its records (state), progress evidence (evidence), reading
the log (log) and the verdict rules (verdict); this package's names are the reducer's.
"""

from __future__ import annotations

from vigil.verify.reducer.state import (
    CPU_BUSY,
    EVIDENCE_WAIT_S,
    EXIT,
    MAX_FATAL,
    MAX_HINTS,
    MAX_STRETCH,
    MAX_WARNINGS,
    MOVE_MIB,
    PHASES,
    RSS_MOVE,
    SETTLE_S,
    STARVED,
    TERMINAL,
    VERDICTS,
    Baseline,
    Evidence,
    Fatal,
    PhaseSpan,
    Verdict,
    Waiting,
    WatchState,
    exit_of,
    initial,
    phase_durations,
    report,
)
from vigil.verify.reducer.verdict import (
    WRAP_S,
    step,
)

__all__ = [
    "CPU_BUSY",
    "EVIDENCE_WAIT_S",
    "EXIT",
    "MAX_FATAL",
    "MAX_HINTS",
    "MAX_STRETCH",
    "MAX_WARNINGS",
    "MOVE_MIB",
    "PHASES",
    "RSS_MOVE",
    "SETTLE_S",
    "STARVED",
    "TERMINAL",
    "VERDICTS",
    "WRAP_S",
    "Baseline",
    "Evidence",
    "Fatal",
    "PhaseSpan",
    "Verdict",
    "Waiting",
    "WatchState",
    "exit_of",
    "initial",
    "phase_durations",
    "report",
    "step",
]
