"""`invoke lab.up|down|status`: the lab's real test hosts (see lab/hosts.py)."""

from __future__ import annotations

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from lab import hosts as lab
from vigil.errors import VigilError


def _fail(exc: VigilError) -> Exit:
    return Exit(f"error: {exc}", code=int(exc.exit_code))


@task(
    help={
        "hosts": "how many lab hosts (lab1..labN); running ones stay",
        "keep": "keep the units, /etc/vigil and /var/lib/vigil of the previous boot",
    }
)
def up(c: Context, hosts: int = 1, keep: bool = False) -> None:
    """Boot N lab hosts and write inventory/hosts.d/lab.yml."""
    try:
        started = lab.up(hosts, clean=not keep)
    except VigilError as exc:
        raise _fail(exc) from None
    for h in started:
        note = f"  failed units: {', '.join(h.failed_units)}" if h.failed_units else ""
        print(f"{h.name}: up, ssh 127.0.0.1:{h.port}, pid {h.pid}{note}")
    print(f"inventory: {lab.INVENTORY_FRAGMENT}")


@task
def down(c: Context) -> None:
    """Power off every lab host and remove the inventory fragment."""
    try:
        stopped = lab.down()
    except VigilError as exc:
        raise _fail(exc) from None
    print(f"stopped: {', '.join(stopped)}" if stopped else "no lab host was running")


@task
def status(c: Context) -> None:
    """Each lab host: running, pid, ssh port, ssh ok."""
    try:
        found = lab.status()
    except VigilError as exc:
        raise _fail(exc) from None
    if not found:
        print("no lab hosts (run `invoke lab.up`)")
    for h in found:
        state = f"running pid {h.pid}" if h.running else "stopped"
        ssh = "ok" if h.ssh_ok else "no"
        print(f"{h.name}: {state}, port {h.port}, ssh {ssh}, log {h.log}")


ns = Collection("lab", up, down, status)
