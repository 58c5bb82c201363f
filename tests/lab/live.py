"""lab5's watched starts, shared by test_verify_live.py and test_stall_learning_live.py
(one lane: tests/lanes.py): the host, its shell, a start, a watched start, a freeze."""

from __future__ import annotations

from pathlib import Path

from lab import hosts as lab
from tests.paths import REPO
from vigil.desired import inventory
from vigil.desired import targets as targets_mod
from vigil.verify import reducer
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Snapshot
from vigil.verify.watch import Outcome, Settings, verify_target

ROOT = REPO
HOST, INDEX = "lab5", 5
POLL_S = 2.0


def sh(command: str, timeout: float = 120.0) -> str:
    rc, out, err = lab.run(INDEX, command, timeout=timeout)
    assert rc == 0, f"{command}: exit {rc}: {err}"
    return out


def target() -> targets_mod.Target:
    return targets_mod.resolve(inventory.load(ROOT / "inventory"), HOST)[0]


# The tests' own cleanup, never under test: it never waits out TimeoutStopSec and ends
# a worker orphaned by the kill -9 test (see lab.stop_now).
STOP = lab.stop_now()


def start(clear_cache: bool = False) -> None:
    clear = "rm -rf /var/cache/vigil/vllm/* /tmp/torchinductor_vllm; " if clear_cache else ""
    sh(f"{STOP}; {clear}systemctl start vllm")


def run_verify(state: Path, settings: Settings, on_poll: object = None) -> Outcome:
    polls: list[tuple[reducer.WatchState, Snapshot]] = []

    def poll(name: str, st: reducer.WatchState, snap: Snapshot, b: Budgets) -> None:
        polls.append((st, snap))
        if callable(on_poll):
            on_poll(st, snap)

    out = verify_target(target(), settings, state, on_poll=poll)
    assert out.error is None, out.error
    assert out.state is not None and out.trace is not None
    assert len(Path(out.trace).read_text().splitlines()) == len(polls)
    return out


def pid_of(snap: Snapshot, comm_part: str) -> int | None:
    if snap.processes is None:
        return None
    for p in snap.processes.items:
        if comm_part in p.comm and p.state not in ("Z", "T"):
            return p.pid
    return None


class FreezeWorkerInCompile:
    """An on_poll hook: SIGSTOP the first worker seen while the start compiles (a frozen
    compile: alive, no progress), remembering when and which."""

    def __init__(self) -> None:
        self.at: list[float] = []
        self.pid: list[int] = []

    def __call__(self, st: reducer.WatchState, snap: Snapshot) -> None:
        pid = pid_of(snap, "Worker")
        if not self.at and pid and st.phase == "compiling":
            sh(f"kill -STOP {pid}")
            self.at.append(snap.time)
            self.pid.append(pid)
