"""What a failing `systemctl` says about the host (pure): systemd missing as PID 1 is
final (nothing vigil installs can ever start there); anything else may pass."""

from __future__ import annotations

# systemctl's own words (src/shared/bus-util.c, src/systemctl): not booted with systemd
# (a container or WSL whose PID 1 is a shell), or no system bus to reach it.
_NO_SYSTEMD = (
    "has not been booted with systemd",
    "Failed to connect to bus",
    "Failed to connect to system scope bus",
)

FIX = ("vigil runs vLLM as a systemd service: use a host booted with systemd as PID 1 "
       "(a VM, a machine, or a container started with systemd, e.g. systemd-nspawn -b); a "
       "plain docker container or WSL without systemd cannot run it")


def no_systemd(error: str | None) -> bool:
    """Whether a systemctl error means systemd does not run this host."""
    return bool(error) and any(w in (error or "") for w in _NO_SYSTEMD)


def pid1_problem(booted: bool | None, pid1: str | None, error: str | None) -> str | None:
    """Why systemd does not manage the host, from its facts (``booted``: systemd's own
    test, /run/systemd/system exists; ``pid1``: /proc/1/comm), or None."""
    if booted is False:
        return f"systemd is not running as PID 1 (PID 1 is {pid1 or 'unknown'}; " \
            "/run/systemd/system is absent)"
    if no_systemd(error):
        return f"systemctl cannot reach systemd: {error}"
    return None
