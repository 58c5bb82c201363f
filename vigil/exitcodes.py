"""Documented exit codes, shared by every task (docs/reference/exit-codes.md, generated
from MEANING by docs/generate.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # deploy: every host ok/changed; verify: ready
    FAILED = 1  # deploy: a host failed to apply or come up
    BAD_INPUT = 2  # inventory, profile, template or flag error; nothing touched
    CRASHED = 3  # verify: the service crashed (cause in the report)
    STALLED = 4  # verify: alive, no progress for the phase's stall window
    TIMED_OUT = 5  # verify: past the hard cap (or 3x a budget learned from history)
    STOPPED = 6  # verify: someone stopped or restarted the unit during the watch
    ROLLOUT_STOPPED = 7  # deploy --serial: past the failure budget; later batches untouched
    UNREACHABLE = 8  # a host could not be reached or logged in to over SSH; nothing ran there


# One exit-code policy for every task: bad input or a refusal first, then the worst
# verdict (timed out > stalled > crashed > stopped), a stopped rollout, an unreachable
# host (Ansible's order: unreachable outranks failed), a failed host.
SEVERITY = (ExitCode.BAD_INPUT, ExitCode.TIMED_OUT, ExitCode.STALLED, ExitCode.CRASHED,
            ExitCode.STOPPED, ExitCode.ROLLOUT_STOPPED, ExitCode.UNREACHABLE,
            ExitCode.FAILED)


def worst(codes: Iterable[int]) -> int:
    """The most important of some exit codes (SEVERITY's order; a code it does not rank
    after those it does, the highest first; none or only 0: 0)."""
    found = {int(c) for c in codes if c}
    return next((int(c) for c in SEVERITY if c in found), max(found, default=0))


# What each code means to the person who ran the task (the reference page's table).
MEANING: Mapping[ExitCode, str] = {
    ExitCode.OK: "deploy: every host `ok` or `changed`; verify: ready",
    ExitCode.FAILED: "a host failed (permission denied, install or start failed, systemctl "
    "could not answer)",
    ExitCode.BAD_INPUT: "bad input (inventory, profile, stack, template, flag or config) or a "
    "refusal (preflight's facts make the deploy impossible); nothing was touched — in every "
    "task",
    ExitCode.CRASHED: "verify (and replay, of a recorded start): crashed",
    ExitCode.STALLED: "verify (and replay): stalled",
    ExitCode.TIMED_OUT: "verify (and replay): timed out",
    ExitCode.STOPPED: "verify (and replay): stopped (the unit was stopped or restarted by "
    "someone else)",
    ExitCode.ROLLOUT_STOPPED: "deploy `--serial`/`--max-fail`: the rollout stopped past the "
    "failure budget; later hosts untouched",
    ExitCode.UNREACHABLE: "a host was unreachable (SSH refused, timed out, closed, host key "
    "or login refused): nothing ran there — every task says `UNREACHABLE` and its recap "
    "counts it apart from `failed`",
}
