"""History of starts: on the host (it describes that host) and mirrored locally.

The host keeps one JSON line per verified start in
`/var/lib/vigil/history/<service>.jsonl`: an ephemeral CI runner reads it back at the
start of every verify and merges it into the local SQLite mirror
(`<state_dir>/history.sqlite`), which `invoke history` and the budget planner query.
Records are `budgets.HistoryRecord`; identity is the record's own content, so merging
the same host file twice adds nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

from vigil.desired.config import HostVars, ModelProfile, Stack
from vigil.desired.render import STATE_ROOT, Rendered
from vigil.errors import ConfigError, HostError
from vigil.transport.remote import call
from vigil.transport.ssh import Transport
from vigil.verify.budgets import BudgetKey, CacheState, HistoryRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
  id TEXT PRIMARY KEY,
  host TEXT NOT NULL,
  model TEXT NOT NULL,
  hardware TEXT NOT NULL,
  cache TEXT NOT NULL,
  started_at REAL NOT NULL,
  verdict TEXT NOT NULL,
  record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_model ON records (model, started_at);
"""


def host_path(service: str) -> str:
    return f"{STATE_ROOT}/history/{service}.jsonl"


# -- keys --------------------------------------------------------------------------


def hardware(host: HostVars, cpu_cores: int | None) -> tuple[str, str]:
    """(hardware, gpu_kind): `8xH200` / `H200` from the inventory, `cpu-2c` / `cpu`."""
    if host.gpu is not None and host.gpu.count > 0:
        return f"{host.gpu.count}x{host.gpu.kind}", host.gpu.kind
    return (f"cpu-{cpu_cores}c" if cpu_cores else "cpu"), "cpu"


def config_hash(rendered: Rendered) -> str:
    """What changes how a start goes: the argv and the non-secret environment."""
    env = {k: v for k, v in sorted(rendered.env.items()) if k not in rendered.secret_names}
    blob = json.dumps({"argv": list(rendered.argv), "env": env}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def stack_versions(stack: Stack) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(stack.packages.items()))


def budget_key(host: HostVars, profile: ModelProfile, stack: Stack, rendered: Rendered,
               cache: CacheState, cpu_cores: int | None) -> BudgetKey:
    hw, kind = hardware(host, cpu_cores)
    return BudgetKey(hardware=hw, gpu_kind=kind, model=profile.name,
                     config_hash=config_hash(rendered), stack=stack_versions(stack),
                     cache=cache)


# -- records ------------------------------------------------------------------------


def record_id(rec: HistoryRecord) -> str:
    return hashlib.sha256(json.dumps(rec.to_dict(), sort_keys=True).encode()).hexdigest()[:20]


def record_from_dict(data: Mapping[str, Any]) -> HistoryRecord:
    """Parse one stored record; ValueError when it is not one."""
    try:
        k = data["key"]
        cache = k["cache"]
        if cache not in ("cold", "warm"):
            raise ValueError(f"cache {cache!r} is not cold/warm")
        key = BudgetKey(hardware=str(k["hardware"]), gpu_kind=str(k["gpu_kind"]),
                        model=str(k["model"]), config_hash=str(k["config_hash"]),
                        stack=str(k["stack"]), cache=cache)
        return HistoryRecord(
            key=key, started_at=float(data["started_at"]), verdict=str(data["verdict"]),
            phases_s={str(p): float(s) for p, s in dict(data["phases_s"]).items()},
            total_s=float(data["total_s"]), cause=data.get("cause"),
            host=str(data.get("host") or ""),
            quiet_s={str(p): float(s) for p, s in dict(data.get("quiet_s") or {}).items()},
            weights_gib_per_gpu=data.get("weights_gib_per_gpu"),
            gpu_count=data.get("gpu_count"),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a history record: missing or bad {exc}") from None


def parse_lines(text: str) -> tuple[list[HistoryRecord], int]:
    """Records from a host's JSONL; (records, lines skipped). A torn last line (a host
    that lost power mid-append) must not cost the rest of the history."""
    out: list[HistoryRecord] = []
    bad = 0
    for line in text.split("\n"):  # JSONL lines end at \n only (not at U+0085 inside one)
        if not line.strip():
            continue
        try:
            out.append(record_from_dict(json.loads(line)))
        except (ValueError, RecursionError):
            bad += 1
    return out, bad


# -- the local mirror ---------------------------------------------------------------


class Mirror:
    """The local SQLite mirror of every host's history."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.skipped = 0  # corrupt rows left out of records()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._db()) as db, db:
                db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open the history mirror: {exc}", file=str(self.path),
                              fix="set vigil.state_dir to a writable directory") from None

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def add(self, records: Iterable[HistoryRecord]) -> int:
        """Insert records not seen yet; returns how many were new."""
        rows = [(record_id(r), r.host, r.key.model, r.key.hardware, r.key.cache, r.started_at,
                 r.verdict, json.dumps(r.to_dict(), sort_keys=True)) for r in records]
        try:
            with closing(self._db()) as db, db:
                before = db.total_changes
                db.executemany("INSERT OR IGNORE INTO records VALUES (?,?,?,?,?,?,?,?)", rows)
                return db.total_changes - before
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot write the history mirror: {exc}", file=str(self.path),
                              fix="move the file aside; `invoke history` rebuilds it from "
                              "the hosts") from None

    def records(self, *, model: str | None = None,
                hosts: Iterable[str] | None = None) -> list[HistoryRecord]:
        sql = "SELECT record FROM records"
        where: list[str] = []
        args: list[Any] = []
        if model:
            where.append("model = ?")
            args.append(model)
        names = list(hosts) if hosts is not None else None
        if names is not None:
            where.append(f"host IN ({','.join('?' * len(names))})")
            args.extend(names)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at"
        out: list[HistoryRecord] = []
        try:
            with closing(self._db()) as db:
                for row in db.execute(sql, args):
                    try:
                        out.append(record_from_dict(json.loads(row[0])))
                    except (ValueError, TypeError, RecursionError):
                        self.skipped += 1  # a corrupt row costs itself, not the history
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot read the history mirror: {exc}", file=str(self.path),
                              fix="move the file aside; `invoke history` rebuilds it from "
                              "the hosts") from None
        return out


# -- the host's copy ----------------------------------------------------------------

def read_host(transport: Transport, host: HostVars) -> tuple[int | None, list[HistoryRecord]]:
    """(CPU cores, records) from the host, one round trip (the agent's `history` verb): the
    core count belongs to the budget key of a CPU host."""
    return _history(transport, host, None)


def append_host(transport: Transport, host: HostVars, record: HistoryRecord) -> None:
    """Append one record to the host's history (one round trip, record on stdin)."""
    _history(transport, host, record)


def _history(transport: Transport, host: HostVars, append: HistoryRecord | None
             ) -> tuple[int | None, list[HistoryRecord]]:
    path = host_path(host.service)
    reply = call(transport, host, "history",
                 {"path": path, "append": append.to_dict() if append else None}, timeout=60)
    if reply.get("error"):
        raise HostError(transport.name, f"history {path}: {reply['error']}",
                        fix="deploy as root, or set sudo: true")
    records, _bad = parse_lines(str(reply.get("text") or ""))
    cores = reply.get("cores")
    return (int(cores) if isinstance(cores, int) and cores > 0 else None), records
