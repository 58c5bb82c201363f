"""Seeding compile caches: a ready start's cache is kept by key on the controller, and the
next host of the same key gets it before it restarts; a start that crashes loading a seed
quarantines it.

The key is what decides whether vLLM could load another host's cache: the hardware, the
model, the rendered flags and variables vLLM hashes and the stack's versions. vLLM still
checks its own hash on load (an entry is one hash's directory), so a key too coarse
costs a copy, never a wrong load.

Pure: the key, the manifest, ``plan_seed`` (the plan's ``seed_cache`` step) and
``harvest_entries`` (what a ready start left). The shell: ``Store`` (a directory on the
controller, or one the inventory names: a shared mount), ``upload`` / ``harvest`` /
``quarantine`` (the host's cache through the agent, in chunks).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from vigil.deploy.plan import Action, ActionKind
from vigil.desired.targets import Target
from vigil.errors import ConfigError, HostError
from vigil.host import caches
from vigil.transport.base import Transport
from vigil.transport.remote import call
from vigil.verify import compile_cache, history
from vigil.verify.compile_cache import CompileCache
from vigil.verify.reducer import Verdict
from vigil.verify.replay import MAX_EPOCH_S

CHUNK = 8 * 1024 * 1024  # bytes per round trip (base64 on the agent's stdin or stdout)
# A packed entry the controller keeps at most (a host may claim any size): the biggest
# compile caches seen are a few GB; what a host unpacks is bounded on its side too.
KEEP_MAX_BYTES = 16 << 30


# -- the key and the manifest (pure) --------------------------------------------------


def key_fields(t: Target) -> dict[str, str]:
    """What a seed's key is made of: the hardware (without a CPU host's core count, which
    no compile depends on), the model, the rendered flags and variables vLLM hashes
    (not a port or a served name) and the stack's versions."""
    hw, _ = history.hardware(t.vars, None)
    inputs = compile_cache.hashed_inputs(t.rendered.argv, t.rendered.env,
                                         t.rendered.secret_names)
    blob = json.dumps(inputs, sort_keys=True).encode()
    return {"hardware": hw, "model": t.profile.name,
            "inputs": hashlib.sha256(blob).hexdigest()[:12],
            "stack": history.stack_versions(t.stack)}


def key_of(fields: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(fields), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Part:
    """One entry of a kept cache, packed on its own (a host gets only what it lacks)."""

    entry: str  # cache-root-relative hash directory, or _tmp/precompiled_headers
    sha256: str
    bytes: int  # the blob's
    files: int
    bytes_raw: int = 0  # the entry's on its host (a harvest's test for "unchanged")

    @property
    def blob(self) -> str:
        return f"{self.sha256}.tar.gz"

    @property
    def short(self) -> str:
        """A hash as vLLM's directory shows it (10 characters), another entry by name."""
        name = self.entry.rsplit("/", 1)[1]
        return name[:10] if self.entry.startswith("torch_") else name


def _sha(value: object) -> str:
    sha = str(value)
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ValueError(f"sha256 {sha!r} is not a sha256")
    return sha


@dataclass(frozen=True)
class Manifest:
    """One kept cache: whose ready start left it and its parts, each with a checksum."""

    key: str
    fields: Mapping[str, str]
    source: str  # the host whose ready start it is
    started_at: float  # that start's epoch s
    parts: tuple[Part, ...]
    compile_s: float | None = None  # the source start's compile (or load) seconds
    state: str = "miss"  # its compile cache: miss (it compiled), partial, hit (it loaded)
    bad: str = ""  # why it is quarantined (never seeded while set)
    bad_at: float | None = None
    # why its source may seed others (Trust): "listed" (cache_seed_from names it) or
    # "canary" (the first host of its rollout); "" for a cache kept before vigil asked
    trust: str = ""
    # hosts that crashed on it but whose word does not quarantine it (Trust.quarantines):
    # never seeded there again, still seeded elsewhere
    refused_by: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.started_at))
        verb = "loaded" if self.state == "hit" else "compiled"
        secs = f", {verb} in {self.compile_s:.1f} s" if self.compile_s is not None else ""
        return (f"{self.source}'s ready start {when} UTC{secs} ({self.bytes / 1e6:.1f} MB, "
                f"{sum(p.files for p in self.parts)} files)")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fields"], out["parts"] = dict(self.fields), [asdict(p) for p in self.parts]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        def num(v: object) -> float | None:
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
                else None

        parts = data["parts"]
        if not isinstance(parts, list):
            raise ValueError("parts is not a list")
        return cls(key=str(data["key"]), fields={str(k): str(v) for k, v in
                                                 dict(data["fields"]).items()},
                   source=str(data["source"]), started_at=float(data["started_at"]),
                   parts=tuple(Part(entry=str(p["entry"]), sha256=_sha(p["sha256"]),
                                    bytes=int(p["bytes"]), files=int(p["files"]),
                                    bytes_raw=int(p.get("bytes_raw") or 0))
                               for p in parts),
                   compile_s=num(data.get("compile_s")),
                   state=str(data.get("state") or "miss"), bad=str(data.get("bad") or ""),
                   bad_at=num(data.get("bad_at")), trust=str(data.get("trust") or ""),
                   refused_by=tuple(str(h) for h in data.get("refused_by") or ()))


def tmp_root(t: Target) -> str:
    """Where torch keeps what TORCHINDUCTOR_CACHE_DIR does not move (the header)."""
    return f"/tmp/torchinductor_{t.vars.service_user}"


@dataclass(frozen=True)
class Trust:
    """Who may seed whom. A compile cache is code (inductor's generated Python, shared
    objects, Triton kernels): a host seeded from another runs what that host wrote. So a
    cache is kept only from a seed source and seeded only where its source is trusted:

    - ``cache_seed_from: [group, host, …]`` (``sources``, resolved by the task): the hosts
      whose ready starts this host may run; a host's own cache is kept only when its
      own list names it. ``[]``: none (a mixed-trust inventory: no host seeds this one).
    - unset (None): the canary rule: a cache is kept only from the first host of a rollout
      (``canary``, the host every later batch waits on), and any host runs a canary's.
    """

    sources: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    canary: str | None = None

    def keeps(self, host: str) -> str | None:
        """Why ``host``'s ready start may be kept for others ("listed", "canary"), or
        None."""
        allowed = self.sources.get(host)
        if allowed is not None:
            return "listed" if host in allowed else None
        return "canary" if host == self.canary else None

    def refuses(self, host: str, m: Manifest) -> str | None:
        """Why ``host`` may not run the kept cache ``m`` (None: it may)."""
        allowed = self.sources.get(host)
        if allowed is not None:
            if m.source in allowed:
                return None
            return (f"{m.source} is not a seed source of {host} (cache_seed_from: "
                    f"{', '.join(sorted(allowed)) or 'none'})")
        if m.trust:
            return None
        return (f"it was kept before vigil asked who may seed ({m.source} was never marked "
                "a seed source); the next ready start of a seed source replaces it")

    def quarantines(self, host: str) -> bool:
        """Whether ``host``'s crash on a seed quarantines it for every host of the key: under
        the canary rule every host is trusted alike; under cache_seed_from only a seed
        source's word counts (any other host could crash on purpose to spoil it)."""
        allowed = self.sources.get(host)
        return allowed is None or host in allowed

    def why_not_kept(self, host: str) -> str:
        if self.sources.get(host) is not None:
            return f"{host} is not in its cache_seed_from"
        return (f"{host} is not this rollout's canary ({self.canary or 'none'}), and no "
                "cache_seed_from names the hosts that may seed others")


def trust_of(targets: Sequence[Target], select: Callable[[str], list[str]]) -> Trust:
    """Each target's ``cache_seed_from`` as the host names it selects (``select``: the
    inventory's pattern matcher); a pattern that selects nothing names the host and
    where it was set."""
    sources: dict[str, frozenset[str] | None] = {}
    for t in targets:
        if t.vars.cache_seed_from is None:
            sources[t.name] = None
            continue
        names: set[str] = set()
        for pattern in t.vars.cache_seed_from:
            try:
                names.update(select(pattern))
            except ConfigError as exc:
                raise ConfigError(f"{t.name}'s cache_seed_from: {pattern!r}: {exc.message}",
                                  file=t.origin.get("cache_seed_from"), key="cache_seed_from",
                                  fix="name hosts or groups of the inventory, or [] for none"
                                  ) from None
        sources[t.name] = frozenset(names)
    return Trust(sources)


def plan_seed(m: Manifest | None, present: Sequence[str], *, root: str, tmp: str,
              user: str) -> Action | None:
    """The plan's seed step: the parts of this key's kept cache that the host lacks
    (None: nothing kept, quarantined, or the host has every entry)."""
    if m is None or m.bad:
        return None
    missing = [p for p in m.parts if p.entry not in set(present)]
    if not missing:
        return None
    size = sum(p.bytes for p in missing) / 1e6
    why = {"listed": "a seed source by cache_seed_from",
           "canary": "the canary of its rollout"}.get(m.trust, m.trust)
    return Action(ActionKind.SEED_CACHE, f"compile cache of {m.describe()}: "
                  f"{', '.join(p.short for p in missing)} ({size:.1f} MB) that this host "
                  f"lacks; it runs code compiled on {m.source} ({why}) (--no-seed compiles "
                  "here instead)",
                  {"root": root, "tmp_root": tmp, "user": user, "key": m.key,
                   "source": m.source,
                   # the harvest's files and bytes bound what the host unpacks
                   "blobs": [{"entry": p.entry, "blob": p.blob, "sha256": p.sha256,
                              "files": p.files, "bytes_raw": p.bytes_raw}
                             for p in missing]})


def harvest_entries(entries: Sequence[Mapping[str, Any]], cc: CompileCache,
                    started_at: float) -> list[str]:
    """The entries a ready start used: those of the hashes vLLM logged (its cache
    directory's 10 characters, the AOT artefact's 64), else the ones it wrote; and the
    precompiled header when there is one."""
    names = [str(e["path"]) for e in entries]
    tmp = [n for n in names if n.startswith("_tmp/")]
    hashed = [n for n in names if n not in tmp]
    hashes = tuple(h for h in cc.hashes if h)
    used = [n for n in hashed if hashes and (n.rsplit("/", 1)[1].startswith(hashes)
                                             or any(h.startswith(n.rsplit("/", 1)[1])
                                                    for h in hashes))]
    if not used:
        used = [str(e["path"]) for e in entries if str(e["path"]) in hashed
                and isinstance(e.get("newest"), (int, float)) and e["newest"] >= started_at]
    return used + tmp if used else []


# Cache states whose start proves the cache it left: compiled (or partly) and served.
HARVESTED = ("miss", "partial", "hit")


def should_harvest(cc: CompileCache | None, verdict: str | None, kept: Manifest | None) -> bool:
    """A ready start that compiled replaces what is kept (a clean compile ends a
    quarantine); one that loaded its cache is kept only when nothing good is."""
    if cc is None or verdict != Verdict.READY or cc.state not in HARVESTED:
        return False
    return cc.state != "hit" or kept is None or bool(kept.bad)


def unchanged(listed: Mapping[str, Any], kept: Manifest | None) -> Part | None:
    """The kept part of an entry the host still holds as it was (same files and bytes):
    a harvest reuses it instead of packing and carrying it again."""
    if kept is None or kept.bad:
        return None
    return next((p for p in kept.parts if p.entry == listed.get("path")
                 and p.files == listed.get("files") and p.bytes_raw == listed.get("bytes")),
                None)


def result_line(res: Mapping[str, Any]) -> str:
    """The deploy's line for the host's seed_cache result."""
    seeded = [Part(str(e), "", 0, 0).short for e in res.get("seeded") or []]
    kept = res.get("kept") or []
    line = (f"compile cache: seeded {', '.join(seeded) or 'nothing'}"
            + (f" ({len(kept)} entry(ies) the host had, left as they were)" if kept else ""))
    if res.get("warning"):
        line += f"; not seeded: {res['warning']} (the start compiles those)"
    return line


def crashed_on_seed(verdict: str | None, phase: str, cc: CompileCache | None) -> bool:
    """A seeded start that crashed while its compile cache was being read: in the compile
    phase, or after vLLM said it loaded from the cache."""
    return verdict == Verdict.CRASHED and (
        phase == "compiling" or (cc is not None and cc.state in ("hit", "partial")))


# -- the store (the controller's directory) -----------------------------------------------


@dataclass
class Store:
    """Kept caches: ``ROOT/KEY/manifest.json`` beside one ``ROOT/KEY/SHA.tar.gz`` per part."""

    root: Path
    warnings: list[str] = field(default_factory=list)

    def _dir(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> Manifest | None:
        path = self._dir(key) / "manifest.json"
        try:
            m = Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
            if not 0 < m.started_at < MAX_EPOCH_S:
                raise ValueError(f"started_at {m.started_at} is not a time")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:
            self.warnings.append(f"{path}: ignored ({exc}); the next ready start replaces it")
            return None
        gone = [p.blob for p in m.parts if not self.blob(m.key, p.blob).is_file()]
        if gone:
            self.warnings.append(f"{path}: its blob {gone[0]} is gone; ignored")
            return None
        return m

    def blob(self, key: str, name: str) -> Path:
        """Where a kept cache's blob (a part's ``blob`` name) lies."""
        return self._dir(key) / name

    def put(self, m: Manifest, blobs: Mapping[str, Path]) -> None:
        """Keep a new cache for its key: new blobs (by sha256) moved in first, then the
        manifest, each by rename (a reader sees the old cache or the new one, never
        half); blobs no part names go."""
        d = self._dir(m.key)
        d.mkdir(parents=True, exist_ok=True)
        for sha, path in blobs.items():
            os.replace(path, d / f"{sha}.tar.gz")
        self._write(m)
        names = {p.blob for p in m.parts}
        for old in d.glob("*.tar.gz"):
            if old.name not in names:
                old.unlink(missing_ok=True)

    def quarantine(self, m: Manifest, why: str, now: float) -> Manifest:
        bad = replace(m, bad=why, bad_at=now)
        self._write(bad)
        return bad

    def refuse(self, m: Manifest, host: str) -> Manifest:
        refused = replace(m, refused_by=tuple(sorted({*m.refused_by, host})))
        self._write(refused)
        return refused

    def _write(self, m: Manifest) -> None:
        d = self._dir(m.key)
        tmp = d / f".manifest-{os.urandom(6).hex()}"
        tmp.write_text(json.dumps(m.to_dict(), indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, d / "manifest.json")


def store_for(t: Target, state_dir: Path) -> Store:
    """The inventory's ``cache_store`` (a directory on the controller, e.g. a shared
    mount), else the state directory's ``caches/``."""
    return Store(Path(t.vars.cache_store) if t.vars.cache_store else state_dir / "caches")


# -- the shell: the host's side through the agent ------------------------------------------

Say = Callable[[str], None]


def _roots(t: Target) -> dict[str, str]:
    """A cache request's roots, and the user the agent reads and writes them as."""
    return {"root": t.rendered.paths.cache, "tmp_root": tmp_root(t),
            "user": t.vars.service_user}


def listing(transport: Transport, t: Target) -> list[dict[str, Any]]:
    """The host's seedable entries, with their files and bytes (one round trip)."""
    reply = call(transport, t.vars, "cache_list", _roots(t), timeout=120)
    return [dict(e) for e in reply.get("entries") or [] if isinstance(e, dict)]


def upload(transport: Transport, t: Target, store: Store, action: Action, say: Say) -> None:
    """Send the kept blobs the host lacks, in chunks; the plan's seed_cache step checks
    each one's sha256 and unpacks it in its turn."""
    key = str(action.payload["key"])
    sent, t0 = 0, time.monotonic()
    for part in action.payload["blobs"]:
        path = store.blob(key, str(part["blob"]))
        if not path.is_file():
            raise HostError(t.name, f"the kept cache's {part['blob']} went away before its "
                            "upload", fix="deploy again (or --no-seed)")
        with path.open("rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        if digest != part["sha256"]:  # content-addressed: changed since its harvest
            raise HostError(t.name, f"the kept cache's {path} is not the blob its harvest "
                            f"checked (sha256 {digest[:12]}, kept as "
                            f"{str(part['sha256'])[:12]}): not sent", fix=f"remove {path.parent}")
        offset = 0
        with path.open("rb") as fh:
            while True:
                data = fh.read(CHUNK)
                call(transport, t.vars, "cache_write", {
                    "blob": part["blob"], "offset": offset,
                    "data": base64.b64encode(data).decode()}, timeout=600)
                offset += len(data)
                if len(data) < CHUNK:
                    break
        sent += offset
    say(f"compile cache: {sent / 1e6:.1f} MB sent for seeding in "
        f"{time.monotonic() - t0:.1f} s")


def _fetch(transport: Transport, t: Target, packed: Mapping[str, Any], into: Path) -> None:
    """Bring one packed blob here in chunks and check its sha256 and size."""
    digest, offset, size = hashlib.sha256(), 0, int(packed["bytes"])
    with into.open("wb") as fh:
        while offset < size:
            reply = call(transport, t.vars, "cache_read",
                         {"blob": packed["blob"], "offset": offset, "size": CHUNK}, timeout=600)
            data = base64.b64decode(str(reply["data"]))
            if not data:
                break
            fh.write(data)
            digest.update(data)
            offset += len(data)
    if digest.hexdigest() != packed["sha256"] or offset != size:
        raise HostError(t.name, f"the packed {packed['entry']} came back as {offset} bytes "
                        f"with sha256 {digest.hexdigest()[:12]}, not {size} bytes with "
                        f"{str(packed['sha256'])[:12]}", fix="deploy again")


def _checked(packed: Mapping[str, Any], path: Path) -> tuple[int, int]:
    """(files, bytes unpacked) of a blob brought here, from the controller's own reading
    of it: a tar.gz of plain files and directories of its entry, within the host's
    bounds; ValueError names what is wrong (harvest makes it the host's HostError, and
    the blob is never kept)."""
    with path.open("rb") as fh:
        try:
            members, total = caches.check_pack(fh, str(packed["entry"]))
        except ValueError as exc:
            raise ValueError(f"the packed {packed['entry']} is refused: {exc}") from None
    return sum(1 for m in members if m.isreg()), total


def harvest(transport: Transport, t: Target, store: Store, cc: CompileCache,
            started_at: float, kept: Manifest | None, say: Say,
            trust: str = "canary") -> Manifest | None:
    """Keep the cache a ready start used: each entry the kept cache lacks (or holds in
    another state) packed on the host, brought here in chunks and checked (its sha256,
    its size under the cap, a tar of its entry's files only); the rest of the kept parts
    reused. ``trust``: why this host may seed others (Trust.keeps)."""
    fields = key_fields(t)
    listed = {str(e["path"]): e for e in listing(transport, t)}
    chosen = harvest_entries(list(listed.values()), cc, started_at)
    if not chosen:
        say("compile cache: nothing to keep (no entry of the hash vLLM logged)")
        return None
    reused = {e: p for e in chosen if (p := unchanged(listed[e], kept)) is not None}
    fresh = [e for e in chosen if e not in reused]
    parts: dict[str, Part] = dict(reused)
    blobs: dict[str, Path] = {}
    store.root.mkdir(parents=True, exist_ok=True)
    reply = call(transport, t.vars, "cache_pack", {**_roots(t), "entries": fresh},
                 timeout=1800) if fresh else {}
    if not isinstance(reply.get("blobs", []), list):
        raise HostError(t.name, "cache_pack: its blobs are not a list")
    packed = [p for p in reply.get("blobs") or [] if isinstance(p, dict)]
    if reply.get("warning"):
        say(f"compile cache: {reply['warning']}")
    try:
        for pk in packed:
            if str(pk.get("entry")) not in fresh:
                raise HostError(t.name, f"cache_pack sent {pk.get('entry')!r}, not asked for")
            size = int(pk["bytes"])
            if not 0 <= size <= KEEP_MAX_BYTES:
                raise HostError(t.name, f"the packed {pk['entry']} claims {size} bytes "
                                f"(kept at most: {KEEP_MAX_BYTES})")
            into = store.root / f".incoming-{os.urandom(6).hex()}"
            blobs[_sha(pk["sha256"])] = into
            _fetch(transport, t, pk, into)
            files, raw = _checked(pk, into)
            parts[str(pk["entry"])] = Part(entry=str(pk["entry"]), sha256=str(pk["sha256"]),
                                          bytes=size, files=files, bytes_raw=raw)
        if not parts:
            raise HostError(t.name, "nothing was packed")
        m = Manifest(key=key_of(fields), fields=fields, source=t.name, started_at=started_at,
                     parts=tuple(parts[e] for e in chosen if e in parts),
                     compile_s=cc.seconds, state=cc.state, trust=trust)
        store.put(m, blobs)
    except ValueError as exc:
        raise HostError(t.name, str(exc)) from None
    finally:
        for path in blobs.values():
            path.unlink(missing_ok=True)
        for pk in packed:
            call(transport, t.vars, "cache_read", {"blob": pk["blob"], "done": True})
    carried = sum(p.bytes for p in m.parts if p.entry in fresh) / 1e6
    say(f"compile cache kept for this key: {m.describe()}; {carried:.1f} MB carried"
        + (f", {len(reused)} part(s) unchanged" if reused else ""))
    return m


def quarantine(transport: Transport, t: Target, store: Store, m: Manifest, seeded: list[str],
               why: str, say: Say, trusted: bool = True) -> None:
    """A start crashed loading a seed: never seed it again until a clean compile replaces
    it (``trusted``: the host's word counts for the key, Trust.quarantines; else never
    here again), and drop what was seeded here so the next start compiles."""
    if not trusted:
        store.refuse(m, t.name)
        dropped = _drop(transport, t, seeded, say)
        say(f"compile cache of {m.describe()} not seeded here again ({why}); {t.name} is no "
            f"seed source, so the key keeps it for other hosts; dropped here: "
            f"{', '.join(dropped) or 'nothing'}")
        return
    store.quarantine(m, why, time.time())
    dropped = _drop(transport, t, seeded, say)
    say(f"compile cache of {m.describe()} QUARANTINED for this key ({why}): not seeded again "
        f"until a clean compile replaces it; dropped here: {', '.join(dropped) or 'nothing'}")


def _drop(transport: Transport, t: Target, seeded: list[str], say: Say) -> list[str]:
    dropped: list[str] = []
    try:
        reply = call(transport, t.vars, "cache_drop", {**_roots(t), "entries": seeded})
        dropped = [str(d) for d in reply.get("dropped") or []]
    except HostError as exc:
        say(f"compile cache: dropping the seeded entries failed: {exc}")
    return dropped


def after_start(transport: Transport, t: Target, store: Store, outcome: Any,
                sown: Action | None, seeded: list[str], say: Say,
                trust: Trust | None = None) -> dict[str, Any]:
    """The compile cache's stage after a verdict: a crash loading a seed quarantines
    it; a ready start's cache is kept for its key when its host is a seed source
    (``trust``). Never fails the deploy. Returns what happened, for the host's JSON."""
    trust = trust if trust is not None else Trust(canary=t.name)
    st, cc = outcome.state, outcome.compile_cache
    out: dict[str, Any] = {
        "seeded_from": sown.payload["source"] if sown is not None and seeded else None,
        "seeded": list(seeded), "kept": None, "quarantined": None}
    try:
        if sown is not None and seeded and crashed_on_seed(st.verdict, st.phase, cc):
            m = store.get(str(sown.payload["key"]))
            if m is not None:
                why = (f"{t.name}'s start crashed in {st.phase} after the seed: "
                       f"{st.cause or 'unknown'}")
                trusted = trust.quarantines(t.name)
                quarantine(transport, t, store, m, seeded, why, say, trusted=trusted)
                out["quarantined" if trusted else "refused"] = why
            return out
        if sown is not None and seeded and cc is not None:
            say(f"compile cache seeded from {sown.payload['source']}: {cc.line()}")
        kept = store.get(key_of(key_fields(t)))
        if st.started_at is not None and should_harvest(cc, st.verdict, kept):
            assert cc is not None
            keeps = trust.keeps(t.name)
            if keeps is None:
                say(f"compile cache: not kept for other hosts: {trust.why_not_kept(t.name)}")
                return out
            m = harvest(transport, t, store, cc, st.started_at, kept, say, trust=keeps)
            out["kept"] = m.describe() if m is not None else None
    except (HostError, OSError, ValueError, KeyError, TypeError) as exc:  # a host's reply
        say(f"compile cache: not kept ({exc})")  # is never why a serving host fails
    return out
