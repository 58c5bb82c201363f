"""A node group's rendezvous check: the host agent's two verbs over real sockets on this
machine (head and worker are both here, as on the lab hosts, which share one network),
judged by vigil.deploy.reach. The group is the golden native group, pointed at a free port
of this machine."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from tests.agent_payload import agent
from tests.paths import FIXTURES
from vigil.deploy import reach
from vigil.desired import inventory
from vigil.desired.groups import NodeGroup, resolve_group

GOLDEN = FIXTURES / "golden-groups" / "inventory"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def group() -> NodeGroup:
    g = resolve_group(inventory.load(GOLDEN), "glm-native", operator_env={"HF_TOKEN": "x"})
    spec = g.spec.model_copy(update={"master_port": _free_port()})
    return replace(g, spec=spec, master_addr="127.0.0.1")


def _run(group: NodeGroup, dial: str | None = None, connect_s: float = 3.0,
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head's listener and one worker's dial, at once, as ``reach.check`` runs them."""
    listen = {**reach.listen_request(group), "timeout": connect_s + 2}
    dialing = {**reach.connect_request(group), "timeout": connect_s}
    if dial is not None:
        dialing["addr"] = dial
    with ThreadPoolExecutor(2) as pool:
        head = pool.submit(agent.reach_listen, listen)
        worker = pool.submit(agent.reach_connect, dialing)
        return head.result(), worker.result()


def test_every_worker_reaching_the_head_is_no_problem(group: NodeGroup) -> None:
    head, worker = _run(group)
    assert head["ports"][0]["bound"] and head["ports"][0]["peers"] == ["127.0.0.1"]
    assert worker["ports"][0]["ok"], worker
    assert reach.problems(group, head, {"gpu-b": worker}) == []
    # the requests name what the backend dials first, and the head's own units
    assert reach.listen_request(group)["units"] == ["vllm.service"]
    assert reach.listen_request(group)["expect"] == 1


def test_a_worker_dialling_an_address_the_head_does_not_listen_on_is_refused(
        group: NodeGroup) -> None:
    """The head listens on 127.0.0.1; the worker dials 127.0.0.2 (loopback too, so no
    timeout): refused after its retries, named with the worker, address, port and fix."""
    head, worker = _run(group, dial="127.0.0.2", connect_s=1.0)
    assert worker["ports"][0]["errno"] == "ECONNREFUSED" and worker["ports"][0]["seconds"] >= 1
    [line] = reach.problems(group, head, {"gpu-b": worker})
    port = group.spec.master_port
    assert line.startswith(f"gpu-b: cannot open TCP to the head gpu-a at 127.0.0.1:{port} "
                           "(master_port): refused")
    assert f"allow {port}/tcp from gpu-b to gpu-a" in line


@pytest.fixture
def stranger(group: NodeGroup) -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", group.spec.master_port))
        s.listen(4)
        yield s


def test_a_port_held_by_another_process_is_refused_naming_it(
        group: NodeGroup, stranger: socket.socket) -> None:
    head, worker = _run(group)
    row = head["ports"][0]
    assert row["held"] and not row["bound"]
    assert [o["pid"] for o in row["owners"]] == [os.getpid()] and not row["owners"][0]["ours"]
    [line] = reach.problems(group, head, {"gpu-b": worker})
    assert line.startswith(f"gpu-a: master_port {group.spec.master_port} is taken by "
                           f"another process (pid {os.getpid()}: ")
    # the group's own unit holding it (a redeploy of a running group) is no problem
    mine = {"ports": [{**row, "owners": [{**row["owners"][0], "ours": True}]}]}
    assert reach.problems(group, mine, {"gpu-b": worker}) == []


def test_a_master_address_that_is_not_the_heads_is_said_once(group: NodeGroup) -> None:
    """192.0.2.1 (TEST-NET-1) is no address of this machine: the head cannot bind it, and
    the worker's dial of it (which cannot work either) is not said again."""
    far = replace(group, master_addr="192.0.2.1")
    head = agent.reach_listen({**reach.listen_request(far), "timeout": 0.5})
    assert head["ports"][0]["errno"] == "EADDRNOTAVAIL"
    worker = {"ports": [{"port": far.spec.master_port, "ok": False, "seconds": 10.0,
                         "errno": "ETIMEDOUT", "error": "timed out"}]}
    [line] = reach.problems(far, head, {"gpu-b": worker})
    assert line == (f"gpu-a: cannot listen on 192.0.2.1:{far.spec.master_port} (master_port): "
                    "it is not an address of the head; fix: set master_addr in "
                    f"{far.file} to an address of gpu-a the workers reach")


def test_a_ray_group_checks_the_ray_head_port_and_counts_its_ray_unit_as_its_own() -> None:
    g = resolve_group(inventory.load(GOLDEN), "glm-ray", operator_env={"HF_TOKEN": "x"})
    assert [p.number for p in reach.ports(g)] == [g.spec.ray_port]
    assert reach.listen_request(g)["units"] == ["vllm.service", "vllm-ray.service"]
