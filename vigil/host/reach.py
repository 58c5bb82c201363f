"""``reach_listen``/``reach_connect``: a node group's rendezvous ports, head and workers.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import Any, Dict

from vigil.host.common import Json, _err, _int, errno_name, service_pids, systemctl_show
from vigil.host.facts import port_owners

# -- a node group's rendezvous: can every worker open TCP to the head? ----------------


def reach_listen(req: Json) -> Json:
    """On a group's head: bind each rendezvous port at `addr` and accept until `expect`
    connections came to each, or `timeout` s passed. A port already listening is not
    bound: its owners are said, with which of them belong to the group's own `units`."""
    ours = set()
    for unit in req.get("units", []):
        show = systemctl_show(unit)
        ours.update(service_pids(show.get("ControlGroup", ""), _int(show.get("MainPID")))[0])
    ports: Dict[int, Json] = {}
    socks: Dict[Any, int] = {}
    for port in req["ports"]:
        held = port_owners(int(port))
        row: Json = {"port": port, "bound": False, "error": None, "peers": [],
                     "held": held["listening"],
                     "owners": [dict(o, ours=o["pid"] in ours) for o in held["owners"]]}
        ports[port] = row
        if held["listening"]:
            continue
        sock = socket.socket(socket.AF_INET6 if ":" in req["addr"] else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((req["addr"], int(port)))
            sock.listen(16)
        except OSError as exc:
            sock.close()
            row["error"] = _err(exc)
            row["errno"] = errno_name(exc)
            continue
        row["bound"] = True
        socks[sock] = port
    deadline = time.monotonic() + float(req.get("timeout", 15))
    try:
        while socks and time.monotonic() < deadline:
            ready, _, _ = select.select(list(socks), [], [], max(0.0, deadline - time.monotonic()))
            for sock in ready:
                conn, peer = sock.accept()
                # the worker closes first, so no TIME_WAIT holds the port the head's
                # rendezvous binds next
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    conn.recv(1)
                conn.close()
                row = ports[socks[sock]]
                row["peers"].append(peer[0])
                if len(row["peers"]) >= int(req.get("expect", 1)):
                    del socks[sock]
                    sock.close()
    finally:
        for sock in socks:
            sock.close()
    return {"ports": [ports[p] for p in req["ports"]]}


def reach_connect(req: Json) -> Json:
    """On a worker: open TCP to `addr` at each port, retrying a refused connection (the
    head may not listen yet) until `timeout` s; then close it."""
    out = []
    for port in req["ports"]:
        started = time.monotonic()
        deadline = started + float(req.get("timeout", 10))
        row: Json = {"port": port, "ok": False, "error": None, "errno": None}
        while True:
            try:
                left = max(0.5, deadline - time.monotonic())
                socket.create_connection((req["addr"], int(port)), timeout=left).close()
                row["ok"] = True
                break
            except OSError as exc:
                row["error"], row["errno"] = _err(exc), errno_name(exc)
                if row["errno"] != "ECONNREFUSED" or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        row["seconds"] = round(time.monotonic() - started, 2)
        out.append(row)
    return {"ports": out}
