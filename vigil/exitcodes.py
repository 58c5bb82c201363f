"""Documented exit codes, shared by every task (README lists them)."""

from __future__ import annotations

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
