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
import math
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

from vigil.desired.config import HostVars, ModelProfile
from vigil.desired.render import STATE_ROOT, Rendered
from vigil.desired.stacks import Stack
from vigil.errors import ConfigError, HostError
from vigil.transport.base import Transport
from vigil.transport.remote import call
from vigil.verify import compile_cache, reducer
from vigil.verify.budgets import BudgetKey, CacheState, HistoryRecord
from vigil.verify.replay import MAX_EPOCH_S

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


# A record's numbers must be times and durations, or it would steer the next budgets:
# NaN compares false with everything (a NaN quiet time turned stall detection off for its
# key), 1e308 widens a stall window to the cap, a negative phase is a clock that ran
# backwards, and 1e300 is no date gmtime can print (`invoke history` died of it).
LONGEST_S = 7 * 86400.0  # no start, phase or quiet stretch of one is longer than a week
MAX_WARNINGS = 10  # ignored lines said one by one per file; then one line for the rest


def _number(value: object, what: str, most: float, unit: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and 0 <= value <= most
    if not ok:
        raise ValueError(f"{what} {value!r} is not {unit} (0 to {most:.0f})")


def check_record(rec: HistoryRecord) -> HistoryRecord:
    """The record when every number in it is a time or a duration; else ValueError that
    names the field and the value."""
    _number(rec.started_at, "started_at", MAX_EPOCH_S, "seconds since the epoch")
    _number(rec.total_s, "total_s", LONGEST_S, "a duration in seconds")
    for name, values in (("phases_s", rec.phases_s), ("quiet_s", rec.quiet_s)):
        for phase, seconds in values.items():
            _number(seconds, f"{name}.{phase}", LONGEST_S, "a duration in seconds")
    if rec.weights_gib_per_gpu is not None:
        _number(rec.weights_gib_per_gpu, "weights_gib_per_gpu", 1e6, "a size in GiB")
    if rec.gpu_count is not None and (not isinstance(rec.gpu_count, int)
                                      or isinstance(rec.gpu_count, bool)):
        raise ValueError(f"gpu_count {rec.gpu_count!r} is not a count")
    if rec.gpu_count is not None:
        _number(rec.gpu_count, "gpu_count", 1e6, "a count")
    return rec


def record_from_dict(data: Mapping[str, Any]) -> HistoryRecord:
    """Parse one stored record; ValueError, naming what is wrong, when it is not one
    (the one check every record read back passes: the host's lines and the mirror's
    rows)."""
    return check_record(_parse_record(data))


def _parse_record(data: Mapping[str, Any]) -> HistoryRecord:
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
            compile_cache=_compile_cache(data.get("compile_cache")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a history record: missing or bad {exc}") from None


def _compile_cache(data: object) -> dict[str, Any] | None:
    """A record's compile_cache as stored (a mapping whose state vigil knows), else None: a
    bad one costs that field, not the record."""
    if isinstance(data, Mapping) and compile_cache.from_record(data) is not None:
        return dict(data)
    return None


def parse_lines(text: str) -> tuple[list[HistoryRecord], int]:
    """Records from a host's JSONL; (records, lines skipped). A torn last line (a host
    that lost power mid-append) must not cost the rest of the history."""
    records, _ = read_lines(text, "history")
    return records, sum(1 for line in text.split("\n") if line.strip()) - len(records)


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "JSON nested too deep"
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:199] + "…"


def read_lines(text: str, file: str) -> tuple[list[HistoryRecord], list[str]]:
    """Records from a host's JSONL and one warning line per line ignored, naming ``file``
    and the line (the first MAX_WARNINGS, then how many more): a torn or hostile line
    costs itself, never the rest of the history."""
    out: list[HistoryRecord] = []
    warnings: list[str] = []
    bad = 0
    for n, line in enumerate(text.split("\n"), 1):  # at \n only (not at U+0085 in one)
        if not line.strip():
            continue
        try:
            out.append(record_from_dict(json.loads(line)))
        except (ValueError, RecursionError) as exc:
            bad += 1
            if bad <= MAX_WARNINGS:
                warnings.append(f"{file} line {n}: {_why(exc)}; record ignored")
    if bad > MAX_WARNINGS:
        warnings.append(f"{file}: {bad - MAX_WARNINGS} more lines ignored")
    return out, warnings


# -- the local mirror ---------------------------------------------------------------


class Mirror:
    """The local SQLite mirror of every host's history."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.skipped = 0  # corrupt rows left out of records()
        self.warnings: list[str] = []  # one line per row left out (MAX_WARNINGS, then a count)
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
        sql = "SELECT id, record FROM records"
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
        self.skipped, self.warnings = 0, []  # of this read
        try:
            with closing(self._db()) as db:
                for row_id, text in db.execute(sql, args):
                    try:
                        out.append(record_from_dict(json.loads(text)))
                    except (ValueError, TypeError, RecursionError) as exc:
                        self.skipped += 1  # a corrupt row costs itself, not the history
                        self._warn(f"{self.path} record {row_id}: {_why(exc)}; record "
                                   "ignored")
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot read the history mirror: {exc}", file=str(self.path),
                              fix="move the file aside; `invoke history` rebuilds it from "
                              "the hosts") from None
        if self.skipped > MAX_WARNINGS:
            self.warnings.append(f"{self.path}: {self.skipped - MAX_WARNINGS} more records "
                                 "ignored")
        return out

    def _warn(self, line: str) -> None:
        if self.skipped <= MAX_WARNINGS:
            self.warnings.append(line)


# -- the host's copy ----------------------------------------------------------------

def read_host(transport: Transport, host: HostVars,
              warn: Callable[[str], None] | None = None,
              ) -> tuple[int | None, list[HistoryRecord]]:
    """(CPU cores, records) from the host, one round trip (the agent's `history` verb): the
    core count belongs to the budget key of a CPU host. ``warn`` gets one line per line of
    the host's file that is ignored."""
    return _history(transport, host, None, warn)


def history_in(transport: Transport, host: HostVars, state_dir: Path, *,
               warn: Callable[[str], None] | None = None,
               note: Callable[[str], None] | None = None) -> tuple[Mirror, int | None]:
    """The stage before a watch (a host's, or a node group's head's): the host's history
    merged into the local mirror; the mirror and the host's CPU cores. ``warn`` gets each
    line of the host's file that is ignored, ``note`` how many records were new."""
    mirror = Mirror(state_dir / "history.sqlite")
    cores, records = read_host(transport, host, warn=warn)
    added = mirror.add(records)
    if added and note is not None:
        note(f"history: {added} record(s) from the host merged into the local mirror")
    return mirror, cores


def own_records(records: Sequence[HistoryRecord], host: str
                ) -> tuple[list[HistoryRecord], int]:
    """The records a host's own file may hold: its own (one with no host is its own), and
    how many others were dropped. A host's file is written by whoever controls the host:
    records "host: h2" in it would stretch h2's stall windows and predictions."""
    own = [r if r.host else replace(r, host=host) for r in records if r.host in ("", host)]
    return own, len(records) - len(own)


def append_host(transport: Transport, host: HostVars, record: HistoryRecord) -> None:
    """Append one record to the host's history (one round trip, record on stdin)."""
    _history(transport, host, record)


def start_record(key: BudgetKey, state: reducer.WatchState, *, host: str, verdict: str,
                 cause: str | None, profile: ModelProfile, gpu_count: int,
                 cache: compile_cache.CompileCache | None = None) -> HistoryRecord | None:
    """The history record of a watched start (a host's or a node group's head's), once
    its verdict is in; None for a start the watch never saw begin."""
    if state.started_at is None:
        return None
    return HistoryRecord(
        key=key, started_at=state.started_at, verdict=verdict,
        phases_s={k: round(v, 3) for k, v in reducer.phase_durations(state).items()},
        total_s=round((state.now or state.started_at) - state.started_at, 3),
        cause=cause, host=host, quiet_s={k: round(v, 3) for k, v in state.quiet_s.items()},
        weights_gib_per_gpu=profile.weights_gib_per_gpu, gpu_count=gpu_count,
        compile_cache=cache.to_record() if cache is not None else None)


def record(transport: Transport, host: HostVars, mirror: Mirror, rec: HistoryRecord) -> None:
    """The stage after a verdict: the start into the host's history, then the mirror (a
    host that refuses the write leaves the mirror as it was)."""
    append_host(transport, host, rec)
    mirror.add([rec])


def _history(transport: Transport, host: HostVars, append: HistoryRecord | None,
             warn: Callable[[str], None] | None = None,
             ) -> tuple[int | None, list[HistoryRecord]]:
    path = host_path(host.service)
    reply = call(transport, host, "history",
                 {"path": path, "append": append.to_dict() if append else None}, timeout=60)
    if reply.get("error"):
        raise HostError(transport.name, f"history {path}: {reply['error']}",
                        fix="deploy as root, or set sudo: true")
    records, warnings = read_lines(str(reply.get("text") or ""), f"{transport.name}:{path}")
    records, foreign = own_records(records, transport.name)
    if foreign:
        warnings.append(f"{transport.name}:{path}: {foreign} record(s) of other hosts "
                        "ignored (a host's history speaks for that host only)")
    if warn is not None:
        for line in warnings:
            warn(line)
    cores = reply.get("cores")
    return (int(cores) if isinstance(cores, int) and cores > 0 else None), records
