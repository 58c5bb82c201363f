"""Before a node group is touched: can every worker open TCP to the head's rendezvous?

A worker that cannot reach the head (a firewall, a security group, a master address only
the head routes to) does not fail: it waits in ``distributed_init`` until a timeout, which
on a large model is found many minutes into a start. So the group deploy asks first: the
head binds each rendezvous port at the group's master address and accepts, every worker
connects, and what failed is refused before any file is written.

The rendezvous ports are the ones a worker dials first: torch.distributed's store on the
head (native, ``--master-port``) or the Ray head's GCS (ray, ``--port``). NCCL's and Ray's
later peer-to-peer ports are chosen at run time and are not tested here.

The judgement is pure (``problems``); ``check`` is the thin shell that calls the agents.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vigil.desired.groups import NodeGroup
from vigil.errors import RefusedError
from vigil.transport.remote import call
from vigil.transport.ssh import connect

LISTEN_S = 15.0  # the head's listener; longer than a worker's tries, so it outlives them
CONNECT_S = 10.0  # a worker retries a refused connection this long (the head may be late)


@dataclass(frozen=True)
class Port:
    key: str  # the group file's key that sets it
    number: int


def ports(group: NodeGroup) -> tuple[Port, ...]:
    """The engine's rendezvous: what the workers dial first on the head."""
    return tuple(Port(key, number) for key, number in group.engine.rendezvous(group.spec))


def units(group: NodeGroup) -> list[str]:
    """The head's own units: a port they hold is the group's, not a stranger's."""
    head = group.nodes[0]
    out = [f"{head.target.vars.service}.service"]
    if head.side is not None:
        out.append(head.side.name)
    return out


def listen_request(group: NodeGroup) -> dict[str, Any]:
    return {"addr": group.master_addr, "ports": [p.number for p in ports(group)],
            "expect": len(group.nodes) - 1, "units": units(group), "timeout": LISTEN_S}


def connect_request(group: NodeGroup) -> dict[str, Any]:
    return {"addr": group.master_addr, "ports": [p.number for p in ports(group)],
            "timeout": CONNECT_S}


def problems(group: NodeGroup, head: Mapping[str, Any],
             workers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What keeps the workers from the head's rendezvous, one line each (none: all
    reached it). ``head``/``workers``: the agents' replies to the two requests."""
    name, addr, file = group.nodes[0].name, group.master_addr, group.file
    keys = {p.number: p.key for p in ports(group)}
    out: list[str] = []
    for row in head["ports"]:
        port, key = row["port"], keys[row["port"]]
        strangers = [o for o in row["owners"] if not o["ours"]]
        if row["held"] and (strangers or not row["owners"]):
            who = "; ".join(f"pid {o['pid']}: {o['cmdline'] or '?'}" for o in strangers) or (
                "a process not visible from the host's PID namespace")
            out.append(f"{name}: {key} {port} is taken by another process ({who}); "
                       f"fix: stop it, or set another {key} in {file}")
        elif row["error"] is not None:
            why = ("it is not an address of the head" if row.get("errno") == "EADDRNOTAVAIL"
                   else row["error"])
            out.append(f"{name}: cannot listen on {addr}:{port} ({key}): {why}; fix: set "
                       f"master_addr in {file} to an address of {name} the workers reach")
    listened = {row["port"] for row in head["ports"] if row["bound"] or row["held"]}
    for worker, reply in workers.items():
        for row in reply["ports"]:
            port = row["port"]
            if row["ok"] or port not in listened:
                continue  # a port the head could not open is said once, above
            how = {"ECONNREFUSED": "refused (a firewall rejects it, or the address is "
                                   "another host's)",
                   "ETIMEDOUT": "no answer (a firewall drops it)",
                   "EHOSTUNREACH": "no route to the host",
                   "ENETUNREACH": "no route to the network"}.get(row["errno"] or "",
                                                                 row["error"])
            out.append(f"{worker}: cannot open TCP to the head {name} at {addr}:{port} "
                       f"({keys[port]}): {how}, after {row['seconds']} s; fix: allow "
                       f"{port}/tcp from {worker} to {name}, or set master_addr in {file} "
                       "to an address of the head this worker reaches")
    return out


def check(group: NodeGroup) -> None:
    """Ask the head and every worker at once; refuse the group if a worker cannot reach
    the head. Nothing is written on any host."""
    head, *rest = group.nodes

    def ask(node_name: str, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        node = next(n for n in group.nodes if n.name == node_name)
        with connect(node.name, node.target.vars) as transport:
            return call(transport, node.target.vars, verb, request,
                        timeout=LISTEN_S + 30)

    with ThreadPoolExecutor(len(group.nodes)) as pool:
        listening = pool.submit(ask, head.name, "reach_listen", listen_request(group))
        dialing = {n.name: pool.submit(ask, n.name, "reach_connect", connect_request(group))
                   for n in rest}
        found = problems(group, listening.result(),
                         {name: f.result() for name, f in dialing.items()})
    if found:
        raise RefusedError(
            f"node group {group.spec.name}: the workers cannot all reach the head's "
            "rendezvous; nothing was changed (each line says its fix):\n    "
            + "\n    ".join(found))
