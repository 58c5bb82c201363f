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
from vigil.errors import HostError
from vigil.transport.base import Transport
from vigil.transport.remote import call
from vigil.verify import compile_cache, history
from vigil.verify.compile_cache import CompileCache
from vigil.verify.reducer import Verdict

CHUNK = 8 * 1024 * 1024  # bytes per round trip (base64 on the agent's stdin or stdout)
SEED_DIR = "/var/lib/vigil/seed"  # the host side's (vigil/host/caches.py)


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
class Manifest:
    """One kept cache: whose ready start left it, its blob's checksum, its entries."""

    key: str
    fields: Mapping[str, str]
    source: str  # the host whose ready start it is
    started_at: float  # that start's epoch s
    sha256: str
    bytes: int
    files: int
    entries: tuple[str, ...]  # cache-root-relative hash directories
    compile_s: float | None = None  # the source start's compile (or load) seconds
    state: str = "miss"  # its compile cache: miss (it compiled), partial, hit (it loaded)
    bad: str = ""  # why it is quarantined (never seeded while set)
    bad_at: float | None = None

    @property
    def blob(self) -> str:
        return f"{self.sha256}.tar.gz"

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.started_at))
        verb = "loaded" if self.state == "hit" else "compiled"
        secs = f", {verb} in {self.compile_s:.1f} s" if self.compile_s is not None else ""
        return (f"{self.source}'s ready start {when} UTC{secs} ({self.bytes / 1e6:.1f} MB, "
                f"{self.files} files, sha256 {self.sha256[:12]})")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fields"], out["entries"] = dict(self.fields), list(self.entries)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        def num(v: object) -> float | None:
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
                else None

        entries = data["entries"]
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ValueError("entries is not a list of paths")
        sha = str(data["sha256"])
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"sha256 {sha!r} is not a sha256")
        return cls(key=str(data["key"]), fields={str(k): str(v) for k, v in
                                                 dict(data["fields"]).items()},
                   source=str(data["source"]), started_at=float(data["started_at"]),
                   sha256=sha, bytes=int(data["bytes"]), files=int(data["files"]),
                   entries=tuple(entries), compile_s=num(data.get("compile_s")),
                   state=str(data.get("state") or "miss"), bad=str(data.get("bad") or ""),
                   bad_at=num(data.get("bad_at")))


def plan_seed(m: Manifest | None, present: Sequence[str], *, root: str,
              user: str) -> Action | None:
    """The plan's seed step: the kept cache of this key when the host lacks any of its
    entries (None: nothing kept, quarantined, or the host has them all)."""
    if m is None or m.bad:
        return None
    missing = [e for e in m.entries if e not in set(present)]
    if not missing:
        return None
    shown = ", ".join(e.rsplit("/", 1)[1][:10] for e in missing)
    return Action(ActionKind.SEED_CACHE, f"compile cache of {m.describe()}; this host lacks "
                  f"{shown} (--no-seed compiles here instead)",
                  {"root": root, "blob": m.blob, "sha256": m.sha256, "key": m.key,
                   "entries": list(m.entries), "user": user, "source": m.source})


def harvest_entries(entries: Sequence[Mapping[str, Any]], cc: CompileCache,
                    started_at: float) -> list[str]:
    """The entries a ready start used: those of the hashes vLLM logged (its cache
    directory's 10 characters, the AOT artefact's 64), else the ones it wrote."""
    names = [str(e["path"]) for e in entries]
    if cc.hashes:
        hashes = tuple(h for h in cc.hashes if h)
        used = [n for n in names if n.rsplit("/", 1)[1].startswith(hashes)
                or any(h.startswith(n.rsplit("/", 1)[1]) for h in hashes)]
        if used:
            return used
    return [str(e["path"]) for e in entries
            if isinstance(e.get("newest"), (int, float)) and e["newest"] >= started_at]


# Cache states whose start proves the cache it left: compiled (or partly) and served.
HARVESTED = ("miss", "partial", "hit")


def should_harvest(cc: CompileCache | None, verdict: str | None, kept: Manifest | None) -> bool:
    """A ready start that compiled replaces what is kept (a clean compile ends a
    quarantine); one that loaded its cache is kept only when nothing good is."""
    if cc is None or verdict != Verdict.READY or cc.state not in HARVESTED:
        return False
    return cc.state != "hit" or kept is None or bool(kept.bad)


def result_line(res: Mapping[str, Any]) -> str:
    """The deploy's line for the host's seed_cache result."""
    if res.get("warning"):
        return f"compile cache: not seeded: {res['warning']}; the start compiles"
    seeded = [str(e).rsplit("/", 1)[1][:10] for e in res.get("seeded") or []]
    kept = res.get("kept") or []
    return (f"compile cache: seeded {', '.join(seeded) or 'nothing'}"
            + (f" ({len(kept)} entry(ies) the host had, left as they were)" if kept else ""))


def crashed_on_seed(verdict: str | None, phase: str, cc: CompileCache | None) -> bool:
    """A seeded start that crashed while its compile cache was being read: in the compile
    phase, or after vLLM said it loaded from the cache."""
    return verdict == Verdict.CRASHED and (
        phase == "compiling" or (cc is not None and cc.state in ("hit", "partial")))


# -- the store (the controller's directory) -----------------------------------------------


@dataclass
class Store:
    """Kept caches: ``ROOT/KEY/manifest.json`` beside ``ROOT/KEY/SHA.tar.gz``."""

    root: Path
    warnings: list[str] = field(default_factory=list)

    def _dir(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> Manifest | None:
        path = self._dir(key) / "manifest.json"
        try:
            m = Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.warnings.append(f"{path}: ignored ({exc}); the next ready start replaces it")
            return None
        if not (self._dir(key) / m.blob).is_file():
            self.warnings.append(f"{path}: its blob {m.blob} is gone; ignored")
            return None
        return m

    def blob(self, m: Manifest) -> Path:
        return self._dir(m.key) / m.blob

    def put(self, m: Manifest, blob: Path) -> None:
        """Keep a new cache for its key (the blob moved in first, then the manifest, each
        by rename: a reader sees the old cache or the new one, never half)."""
        d = self._dir(m.key)
        d.mkdir(parents=True, exist_ok=True)
        os.replace(blob, d / m.blob)
        self._write(m)
        for old in d.glob("*.tar.gz"):
            if old.name != m.blob:
                old.unlink(missing_ok=True)

    def quarantine(self, m: Manifest, why: str, now: float) -> Manifest:
        bad = replace(m, bad=why, bad_at=now)
        self._write(bad)
        return bad

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


def _agent(transport: Transport, t: Target, verb: str, req: dict[str, Any],
           timeout: float = 600) -> dict[str, Any]:
    reply = call(transport, t.vars, verb, req, timeout=timeout)
    return reply


def present(transport: Transport, t: Target) -> list[str]:
    """The host's cache entries (one round trip)."""
    reply = _agent(transport, t, "cache_list", {"root": t.rendered.paths.cache}, timeout=120)
    return [str(e["path"]) for e in reply.get("entries") or []]


def upload(transport: Transport, t: Target, store: Store, action: Action, say: Say) -> None:
    """Send the kept blob to the host in chunks; the plan's seed_cache step checks its
    sha256 and unpacks it in its turn."""
    m = store.get(store_key(action))
    if m is None:
        raise HostError(t.name, f"the kept cache {action.payload['blob']} went away before "
                        "its upload", fix="deploy again (or --no-seed)")
    path = store.blob(m)
    sent = 0
    t0 = time.monotonic()
    with path.open("rb") as fh:
        while True:
            data = fh.read(CHUNK)
            if not data and sent:
                break
            _agent(transport, t, "cache_write", {
                "blob": m.blob, "offset": sent, "data": base64.b64encode(data).decode()})
            sent += len(data)
            if len(data) < CHUNK:
                break
    say(f"compile cache: {sent / 1e6:.1f} MB sent for seeding in "
        f"{time.monotonic() - t0:.1f} s")


def store_key(action: Action) -> str:
    return str(action.payload["key"])


def harvest(transport: Transport, t: Target, store: Store, cc: CompileCache,
            started_at: float, say: Say) -> Manifest | None:
    """Keep the cache a ready start used: pack its entries on the host, bring the blob
    here in chunks, check its sha256, and keep it for the key."""
    fields = key_fields(t)
    root = t.rendered.paths.cache
    listed = _agent(transport, t, "cache_list", {"root": root}, timeout=120)
    chosen = harvest_entries(listed.get("entries") or [], cc, started_at)
    if not chosen:
        say("compile cache: nothing to keep (no entry of the hash vLLM logged)")
        return None
    packed = _agent(transport, t, "cache_pack", {"root": root, "entries": chosen},
                    timeout=1800)
    blob, size = str(packed["blob"]), int(packed["bytes"])
    store.root.mkdir(parents=True, exist_ok=True)
    tmp = store.root / f".incoming-{os.urandom(6).hex()}"
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as fh:
            offset = 0
            while offset < size:
                reply = _agent(transport, t, "cache_read",
                               {"blob": blob, "offset": offset, "size": CHUNK})
                data = base64.b64decode(str(reply["data"]))
                if not data:
                    break
                fh.write(data)
                digest.update(data)
                offset += len(data)
        if digest.hexdigest() != packed["sha256"] or offset != size:
            raise HostError(t.name, f"the packed compile cache came back as {offset} bytes "
                            f"with sha256 {digest.hexdigest()[:12]}, not {size} bytes with "
                            f"{str(packed['sha256'])[:12]}", fix="deploy again")
        m = Manifest(key=key_of(fields), fields=fields, source=t.name, started_at=started_at,
                     sha256=digest.hexdigest(), bytes=size, files=int(packed["files"]),
                     entries=tuple(chosen), compile_s=cc.seconds, state=cc.state)
        store.put(m, tmp)
    finally:
        tmp.unlink(missing_ok=True)
        _agent(transport, t, "cache_read", {"blob": blob, "done": True})
    say(f"compile cache kept for this key: {m.describe()}")
    return m


def quarantine(transport: Transport, t: Target, store: Store, m: Manifest, seeded: list[str],
               why: str, say: Say) -> None:
    """A start crashed loading a seed: never seed it again until a clean compile replaces
    it, and drop what was seeded here so the next start compiles."""
    store.quarantine(m, why, time.time())
    dropped: list[str] = []
    try:
        reply = _agent(transport, t, "cache_drop", {"root": t.rendered.paths.cache,
                                                    "entries": seeded})
        dropped = [str(d) for d in reply.get("dropped") or []]
    except HostError as exc:
        say(f"compile cache: dropping the seeded entries failed: {exc}")
    say(f"compile cache of {m.describe()} QUARANTINED for this key ({why}): not seeded again "
        f"until a clean compile replaces it; dropped here: {', '.join(dropped) or 'nothing'}")


def after_start(transport: Transport, t: Target, store: Store, outcome: Any,
                sown: Action | None, seeded: list[str], say: Say) -> None:
    """The compile cache's stage after a verdict: a crash loading a seed quarantines
    it; a ready start's cache is kept for its key. Never fails the deploy."""
    st, cc = outcome.state, outcome.compile_cache
    try:
        if sown is not None and seeded and crashed_on_seed(st.verdict, st.phase, cc):
            m = store.get(store_key(sown))
            if m is not None:
                why = (f"{t.name}'s start crashed in {st.phase} after the seed: "
                       f"{st.cause or 'unknown'}")
                quarantine(transport, t, store, m, seeded, why, say)
            return
        if sown is not None and seeded and cc is not None:
            say(f"compile cache seeded from {sown.payload['source']}: {cc.line()}")
        kept = store.get(key_of(key_fields(t)))
        if st.started_at is not None and should_harvest(cc, st.verdict, kept):
            assert cc is not None
            harvest(transport, t, store, cc, st.started_at, say)
    except (HostError, OSError) as exc:
        say(f"compile cache: not kept ({exc})")
