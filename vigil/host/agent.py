"""vigil's host side: stdlib-only, sent on stdin and run by ``python3 -c BOOTSTRAP VERB``
over SSH (vigil/transport/remote.py), this module last of the parts payload.py joins.

Every verb reads one JSON request on stdin and prints one JSON reply on stdout. Secrets
travel on stdin only, never on a command line (which any user could read in /proc). One
call is one SSH round trip: ``facts`` reads everything a plan needs, ``apply`` runs a
whole plan (one applier per action kind, ``APPLIERS``), ``rollback`` restores the last
release, ``status``/``packages``/``role_facts`` read, ``probe`` is one poll of a starting
service (run on the service environment's python, where NVML is importable), ``stream``
follows it instead (one JSON line per event, until stdin closes), ``smoke``
one real completion, ``history`` the host's start records, ``logs`` the journal,
``reach_listen``/``reach_connect`` a node group's rendezvous ports, head and workers,
``cache_*`` a compile cache carried from one host to another (caches.py). The
verbs share one set of helpers (common.py: systemctl show, HTTP, process tree); each
verb family is its own module (facts, install, apply, roles, probe, stream, smoke,
history, reach). Python 3.8+ on purpose: it runs on the host's own python3.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

from vigil.host.apply import apply, rollback, status
from vigil.host.caches import cache_drop, cache_list, cache_pack, cache_read, cache_write
from vigil.host.common import Json, _err
from vigil.host.facts import facts
from vigil.host.history import history, logs
from vigil.host.install import packages
from vigil.host.probe import probe
from vigil.host.reach import reach_connect, reach_listen
from vigil.host.roles import role_facts
from vigil.host.smoke import smoke
from vigil.host.stream import stream_main

VERBS: Dict[str, Any] = {"status": status, "facts": facts, "apply": apply, "rollback": rollback,
                         "packages": packages, "role_facts": role_facts, "probe": probe,
                         "smoke": smoke, "history": history, "logs": logs,
                         "reach_listen": reach_listen, "reach_connect": reach_connect,
                         "cache_list": cache_list, "cache_pack": cache_pack,
                         "cache_read": cache_read, "cache_write": cache_write,
                         "cache_drop": cache_drop}


def main(argv: List[str], text: str) -> Json:
    """One reply for any request: a malformed one (bad JSON, unknown verb, missing key)
    gets {"agent_error": ...}, never a traceback."""
    verb = VERBS.get(argv[1]) if len(argv) > 1 else None
    if verb is None:
        return {"agent_error": "unknown verb %r" % (argv[1:2] or [""])[0]}
    try:
        request = json.loads(text or "{}")
        if not isinstance(request, dict):
            raise ValueError("the request is not a JSON object")
        reply: Json = verb(request)
        return reply
    except Exception as exc:
        return {"agent_error": "malformed %s request: %s" % (argv[1], _err(exc))}


if __name__ == "__main__":
    if sys.argv[1:2] == ["stream"]:  # a channel, not one request and one reply
        sys.exit(stream_main())
    sys.stdout.write(json.dumps(main(sys.argv, sys.stdin.read())))
