"""Seeding compile caches: the key, the plan's seed step, what a ready start keeps, the
store, and the host side (list, pack, chunks, seed, drop) on real files."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pwd
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.agent_payload import agent
from tests.doubles import agent_verb
from tests.paths import REPO
from vigil.deploy import apply as apply_mod
from vigil.deploy import seed
from vigil.deploy.plan import Action, ActionKind, Plan
from vigil.desired import inventory
from vigil.desired.targets import Target, resolve
from vigil.errors import ConfigError, HostError
from vigil.report import HostResult, HostStatus, Log
from vigil.tasks import deploy as deploy_task
from vigil.transport.base import Result
from vigil.transport.local import LocalTransport
from vigil.verify import reducer
from vigil.verify.compile_cache import CompileCache
from vigil.verify.reducer import PhaseSpan, Verdict
from vigil.verify.watch import Outcome

AOT = "torch_compile_cache/torch_aot_compile/" + "40d4ff84fc" + "5" * 54
GRAPHS = "torch_compile_cache/1a2b3c4d5e"


def _targets(tmp_path: Path, hosts: str) -> dict[str, Target]:
    inv = tmp_path / "inventory"
    inv.mkdir()
    for d in ("models", "stacks"):
        (inv / d).symlink_to(REPO / "inventory" / d)
    (inv / "hosts.yml").write_text(hosts)
    return {t.name: t for t in resolve(inventory.load(inv), "all", operator_env={},
                                       require_secrets=False)}


# -- the key ------------------------------------------------------------------------------


def test_hosts_that_differ_only_in_port_share_a_key_and_a_hashed_variable_splits_it(
        tmp_path: Path) -> None:
    ts = _targets(tmp_path, """hosts:
  a: {address: a.invalid, model: tiny-cpu, port: 8001}
  b: {address: b.invalid, model: tiny-cpu, port: 8002}
  c: {address: c.invalid, model: tiny-cpu, port: 8001, env: {VLLM_CPU_ATTN_SPLIT_KV: "0"}}
  d: {address: d.invalid, model: tiny-cpu, port: 8001, env: {VLLM_LOGGING_LEVEL: DEBUG,
                                                              VLLM_CPU_KVCACHE_SPACE: "2"}}
""")
    key = {n: seed.key_of(seed.key_fields(t)) for n, t in ts.items()}
    assert key["a"] == key["b"]
    assert key["c"] != key["a"]  # vLLM hashes it: another cache
    assert key["d"] == key["a"]  # vLLM leaves logging and the KV cache size out


# -- the plan's step (pure) ---------------------------------------------------------------


PARTS = (seed.Part(AOT, "ab" * 32, 12_300_000, 40), seed.Part(GRAPHS, "cd" * 32, 1000, 3))


def _manifest(**kw: object) -> seed.Manifest:
    base: dict[str, object] = dict(
        key="k" * 16, fields={"model": "tiny-cpu"}, source="lab1", started_at=1764662400.0,
        parts=PARTS, compile_s=47.4)
    base.update(kw)
    return seed.Manifest(**base)  # type: ignore[arg-type]


def test_the_plan_seeds_what_the_host_lacks_and_says_from_which_start() -> None:
    step = seed.plan_seed(_manifest(), [GRAPHS], root="/var/cache/vigil/vllm",
                          tmp="/tmp/torchinductor_vllm", user="vllm")
    assert step is not None and step.kind == "seed_cache"
    assert "lab1's ready start 2025-12-02 08:00 UTC, compiled in 47.4 s" in step.reason
    assert "40d4ff84fc (12.3 MB) that this host lacks" in step.reason
    assert "1a2b3c4d5e" not in step.reason  # the host has that one: not sent
    (part,) = (p for p in _manifest().parts if p.entry == AOT)
    assert step.payload["blobs"] == [{"entry": AOT, "blob": "ab" * 32 + ".tar.gz",
                                      "sha256": "ab" * 32, "files": part.files,
                                      "bytes_raw": part.bytes_raw}]
    assert step.payload["user"] == "vllm"


@pytest.mark.parametrize("m, present", [
    (None, []),
    (_manifest(bad="lab2's start crashed in compiling after the seed"), []),
    (_manifest(), [AOT, GRAPHS]),
])
def test_no_seed_without_a_good_cache_the_host_lacks(m: seed.Manifest | None,
                                                     present: list[str]) -> None:
    assert seed.plan_seed(m, present, root="/c", tmp="/t", user="vllm") is None


def test_a_ready_start_keeps_the_entries_of_the_hashes_vllm_logged() -> None:
    listed = [{"path": AOT, "newest": 1.0}, {"path": GRAPHS, "newest": 1.0},
              {"path": "torch_compile_cache/ffffffffff", "newest": 500.0},
              {"path": "_tmp/precompiled_headers", "newest": 1.0}]
    cc = CompileCache(state="miss", hashes=("40d4ff84fc" + "5" * 54,))
    assert seed.harvest_entries(listed, cc, started_at=100.0) == [
        AOT, "_tmp/precompiled_headers"]
    # nothing logged: what this start wrote
    assert seed.harvest_entries(listed, CompileCache(state="miss"), 100.0) == [
        "torch_compile_cache/ffffffffff", "_tmp/precompiled_headers"]
    # no entry of its own: the header alone is no cache of this start
    assert seed.harvest_entries(listed[-1:], cc, 100.0) == []


@pytest.mark.parametrize("state, verdict, kept, want", [
    ("miss", "ready", None, True),
    ("miss", "ready", _manifest(), True),  # a clean compile replaces what is kept
    ("hit", "ready", _manifest(), False),  # it loaded what is kept
    ("hit", "ready", None, True),  # a warm host seeds the fleet
    ("hit", "ready", _manifest(bad="crashed"), True),  # ends the quarantine
    ("miss", "crashed", None, False),
    ("off", "ready", None, False),
    ("unknown", "ready", None, False),
])
def test_what_a_start_keeps(state: str, verdict: str, kept: seed.Manifest | None,
                            want: bool) -> None:
    assert seed.should_harvest(CompileCache(state=state), verdict, kept) is want  # type: ignore[arg-type]


def test_only_a_crash_while_the_cache_is_read_blames_the_seed() -> None:
    assert seed.crashed_on_seed("crashed", "compiling", None)
    assert seed.crashed_on_seed("crashed", "cuda_graphs", CompileCache(state="hit"))
    assert not seed.crashed_on_seed("crashed", "loading_weights", CompileCache(state="unknown"))
    assert not seed.crashed_on_seed("stalled", "compiling", None)


# -- the store ----------------------------------------------------------------------------


def test_the_store_keeps_one_cache_per_key_and_quarantines_it(tmp_path: Path) -> None:
    store = seed.Store(tmp_path / "caches")

    def blob(text: str) -> Path:
        (tmp_path / text).write_text(text)
        return tmp_path / text

    m = _manifest()
    store.put(m, {"ab" * 32: blob("x"), "cd" * 32: blob("y")})
    assert store.get(m.key) == m and store.blob(m.key, PARTS[0].blob).read_text() == "x"
    bad = store.quarantine(m, "lab2's start crashed in compiling after the seed", 5.0)
    assert store.get(m.key) == bad and bad.bad and bad.bad_at == 5.0
    # a newer cache replaces it; the part it shares stays, the other blob goes
    new = _manifest(parts=(PARTS[1], seed.Part(AOT, "ef" * 32, 5, 1)))
    store.put(new, {"ef" * 32: blob("z")})
    assert store.get(m.key) == new
    assert sorted(p.name for p in (tmp_path / "caches" / m.key).iterdir()) == [
        "cd" * 32 + ".tar.gz", "ef" * 32 + ".tar.gz", "manifest.json"]


def test_a_damaged_manifest_is_ignored_with_a_warning_naming_it(tmp_path: Path) -> None:
    store = seed.Store(tmp_path)
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "manifest.json").write_text(json.dumps({"key": "k", "parts": "nope"}))
    assert store.get("k") is None
    assert len(store.warnings) == 1 and "manifest.json: ignored" in store.warnings[0]


# -- the host side, on real files ---------------------------------------------------------


HEADER = "_tmp/precompiled_headers"


def _cache(root: Path, tmp: Path | None = None) -> None:
    files = [(root / AOT / "rank_0_0/model", "aot"),
             (root / GRAPHS / "rank_0_0/backbone/vllm_compile_cache.py", "graphs"),
             (root / "torch_compile_cache/modelinfos/x.json", "not a hash")]
    if tmp is not None:
        files.append((tmp / "precompiled_headers/cur5uit.h.gch", "header"))
    for p, text in files:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        os.utime(p, (1000.0, 1000.0))


def _roots(tmp_path: Path, host: str) -> dict[str, str]:
    return {"root": str(tmp_path / host / "cache"), "tmp_root": str(tmp_path / host / "tmp"),
            "user": "root"}


def _carry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
           entries: list[str]) -> list[dict[str, object]]:
    """Pack on host a (a blob per entry), read each out in chunks, write it to host b in
    chunks: the blobs as the seed step names them."""
    monkeypatch.setattr(agent, "SEED_DIR", str(tmp_path / "seed-a"))
    packed = agent.cache_pack({**_roots(tmp_path, "a"), "entries": entries})["blobs"]
    datas = []
    for blob in packed:
        data, off = b"", 0
        while True:
            r = agent.cache_read({"blob": blob["blob"], "offset": off, "size": 7})
            data += base64.b64decode(r["data"])
            off += 7
            if r["eof"]:
                break
        agent.cache_read({"blob": blob["blob"], "done": True})
        assert not (tmp_path / "seed-a" / blob["blob"]).exists()
        datas.append(data)
    monkeypatch.setattr(agent, "SEED_DIR", str(tmp_path / "seed-b"))
    for blob, data in zip(packed, datas, strict=True):
        for i in range(0, max(len(data), 1), 5):
            agent.cache_write({"blob": blob["blob"], "offset": i,
                               "data": base64.b64encode(data[i:i + 5]).decode()})
    return [{"entry": b["entry"], "blob": b["blob"], "sha256": b["sha256"]} for b in packed]


def test_a_cache_carried_in_chunks_seeds_the_entries_the_host_lacks_and_keeps_its_own(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _cache(tmp_path / "a" / "cache", tmp_path / "a" / "tmp")
    listed = agent.cache_list(_roots(tmp_path, "a"))["entries"]
    assert sorted(e["path"] for e in listed) == sorted([AOT, GRAPHS, HEADER])  # no modelinfos
    blobs = _carry(monkeypatch, tmp_path, [AOT, GRAPHS, HEADER])
    assert len({b["sha256"] for b in blobs}) == 3  # a blob per entry
    b = tmp_path / "b" / "cache"
    (b / GRAPHS).mkdir(parents=True)
    (b / GRAPHS / "mine").write_text("the host's own")
    res = agent.seed({**_roots(tmp_path, "b"), "blobs": blobs, "user": "root"}, {})
    assert res == {"ok": True, "seeded": [AOT, HEADER], "kept": [GRAPHS]}
    model = b / AOT / "rank_0_0" / "model"
    assert model.read_text() == "aot" and model.stat().st_mtime == 1000.0  # warm: older
    header = tmp_path / "b" / "tmp" / "precompiled_headers" / "cur5uit.h.gch"
    assert header.read_text() == "header"
    assert sorted(p.name for p in (b / GRAPHS).iterdir()) == ["mine"]  # never written over
    staged = [p for p in (b / AOT).parent.iterdir() if p.name.startswith(".vigil-seed-")]
    assert staged == [] and not list((tmp_path / "seed-b").iterdir())
    assert agent.cache_drop({**_roots(tmp_path, "b"), "entries": [AOT, HEADER]}) == {
        "dropped": [AOT, HEADER]}
    assert not (b / AOT).exists() and not header.exists() and (b / GRAPHS).exists()


def test_a_checksum_mismatch_seeds_that_entry_not_and_says_so(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _cache(tmp_path / "a" / "cache")
    blobs = _carry(monkeypatch, tmp_path, [AOT, GRAPHS])
    blobs[0]["sha256"] = "0" * 64
    res = agent.seed({**_roots(tmp_path, "b"), "blobs": blobs, "user": "root"}, {})
    assert res["ok"] and res["seeded"] == [GRAPHS]
    assert res["warning"].startswith(f"{AOT}: the upload's sha256 is ")
    assert not (tmp_path / "b" / "cache" / AOT).exists()


def test_a_header_directory_someone_else_made_in_tmp_is_not_written_into(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _cache(tmp_path / "a" / "cache", tmp_path / "a" / "tmp")
    blobs = _carry(monkeypatch, tmp_path, [HEADER])
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tmp").symlink_to(tmp_path / "elsewhere")  # planted in /tmp
    res = agent.seed({**_roots(tmp_path, "b"), "blobs": blobs, "user": "root"}, {})
    assert res["seeded"] == [] and "is not a directory of the service user's" in res["warning"]
    assert not list((tmp_path / "elsewhere").iterdir())


@pytest.mark.parametrize("member, why", [
    ("../../etc/cron.d/x", "unsafe path"),
    (AOT + "/link", "not a plain file"),
    ("torch_compile_cache/other0000/x", "outside the entry"),
])
def test_a_packed_cache_with_a_bad_member_seeds_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, member: str, why: str) -> None:
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    monkeypatch.setattr(agent, "SEED_DIR", str(seed_dir))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(member)
        if why == "not a plain file":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/shadow"
            tar.addfile(info)
        else:
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (seed_dir / f"{digest}.tar.gz").write_bytes(buf.getvalue())
    res = agent.seed({**_roots(tmp_path, "b"), "user": "root", "blobs": [
        {"entry": AOT, "blob": f"{digest}.tar.gz", "sha256": digest}]}, {})
    assert res["seeded"] == [] and why in res["warning"]
    assert not (tmp_path / "etc").exists() and not (tmp_path / "b" / "cache" / AOT).exists()


def test_the_agent_refuses_a_path_that_is_not_a_cache_entry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a cache entry"):
        agent.cache_drop({"root": str(tmp_path), "tmp_root": "/tmp", "entries": ["../../etc"]})
    with pytest.raises(ValueError, match="not a cache blob name"):
        agent.cache_read({"blob": "../x", "offset": 0, "size": 1})


# -- the stage after the verdict, through the real agent over the local transport ----------


def _outcome(verdict: str, phase: str, cc: CompileCache, started_at: float) -> Outcome:
    state = replace(reducer.initial(), verdict=Verdict(verdict), started_at=started_at,
                    cause="unknown" if verdict == "crashed" else None,
                    spans=(PhaseSpan(phase, started_at),))
    out = Outcome("local")
    out.state, out.compile_cache = state, cc
    return out


def test_a_ready_start_is_kept_and_a_crash_on_its_seed_quarantines_and_drops_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # this machine's own /tmp/torchinductor_vllm stays out of it
    monkeypatch.setattr(seed, "tmp_root", lambda t: str(tmp_path / "tmp"))
    (t,) = _targets(tmp_path, """hosts:
  local: {address: localhost, connection: local, model: tiny-cpu, service_user: root}
""").values()
    root = tmp_path / "cache"
    _cache(root)
    (root / AOT / "rank_0_0" / "model").touch()  # this start wrote it
    t = replace(t, rendered=replace(t.rendered, paths=replace(t.rendered.paths,
                                                             cache=str(root))))
    store, said = seed.Store(tmp_path / "caches"), list[str]()
    with LocalTransport("local") as tr:
        cc = CompileCache(state="miss", seconds=47.4, hashes=(AOT.rsplit("/", 1)[1],))
        seed.after_start(tr, t, store, _outcome("ready", "api_starting", cc, 1000.5), None,
                         [], said.append)
        kept = store.get(seed.key_of(seed.key_fields(t)))
        assert kept is not None and [p.entry for p in kept.parts] == [AOT]
        assert kept.source == "local" and kept.compile_s == 47.4 and not kept.bad
        assert "compile cache kept for this key: local's ready start" in said[-1]
        with tarfile.open(store.blob(kept.key, kept.parts[0].blob)) as tar:
            assert tar.getnames()[0] == AOT and AOT + "/rank_0_0/model" in tar.getnames()
        # the same start again: the entry is as kept, so nothing is carried again
        seed.after_start(tr, t, store, _outcome("ready", "api_starting", cc, 1000.5), None,
                         [], said.append)
        assert "0.0 MB carried, 1 part(s) unchanged" in said[-1]
        # the next host was seeded from it, and crashed while compiling
        step = seed.plan_seed(kept, [], root=str(root), tmp="/nonexistent", user="root")
        assert step is not None
        told = seed.after_start(tr, t, store, _outcome("crashed", "compiling",
                                                       CompileCache(state="hit"), 2000.0),
                                step, [AOT], said.append)
    bad = store.get(kept.key)
    assert bad is not None and bad.bad.startswith("local's start crashed in compiling")
    assert "QUARANTINED" in said[-1] and f"dropped here: {AOT}" in said[-1]
    assert told == {"seeded_from": "local", "seeded": [AOT], "kept": None,
                    "quarantined": bad.bad}  # the host's JSON
    assert not (root / AOT).exists() and (root / GRAPHS).exists()
    assert seed.plan_seed(bad, [], root=str(root), tmp="/t", user="root") is None


def test_a_rollout_check_says_which_later_hosts_the_first_ready_start_of_their_key_seeds(
        tmp_path: Path) -> None:
    ts = _targets(tmp_path, """hosts:
  a: {address: a.invalid, model: tiny-cpu, port: 8001}
  b: {address: b.invalid, model: tiny-cpu, port: 8002}
  c: {address: c.invalid, model: tiny-cpu, port: 8003}
  d: {address: d.invalid, model: tiny-cpu, env: {VLLM_CPU_ATTN_SPLIT_KV: "0"}}
  e: {address: e.invalid, model: tiny-cpu, cache_seed: false}
""")
    restart = ["restart: runtime, unit, env changed"]
    results = [HostResult(n, HostStatus.CHANGED, actions=list(restart)) for n in ts]
    results[2].actions = []  # c does not restart
    out = io.StringIO()
    later = deploy_task.seeded_later(list(ts.values()), [["a"], ["b", "c", "d", "e"]],
                                     results, Log(out))
    assert later == {"b": "a"}  # c: no restart; d: another key; e: cache_seed false
    assert "b        would seed_cache: from a's start (an earlier batch" in out.getvalue()
    # hosts of one batch start together: none seeds another
    assert deploy_task.seeded_later(list(ts.values()), [["a", "b"]], results, Log(out)) == {}


# -- attacks on the host side (issue 33.1, 33.3, 33.7, 33.8), each as it was made ---------


NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory the service user (nobody) can reach (pytest's tmp_path is root's 0700),
    with root's own SEED_DIR inside it."""
    base = Path(tempfile.mkdtemp(prefix="vigil-seed-"))
    base.chmod(0o755)
    seed_dir = base / "seed"
    seed_dir.mkdir(mode=0o700)
    monkeypatch.setattr(agent, "SEED_DIR", str(seed_dir))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _nobody_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return path


def _blob(seed_dir: Path, members: list[tuple[str, bytes | None]]) -> dict[str, object]:
    """A tar.gz upload in SEED_DIR of the given members (None: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return _upload(seed_dir, buf.getvalue())


def _upload(seed_dir: Path, raw: bytes, entry: str = GRAPHS) -> dict[str, object]:
    digest = hashlib.sha256(raw).hexdigest()
    (seed_dir / f"{digest}.tar.gz").write_bytes(raw)
    return {"entry": entry, "blob": f"{digest}.tar.gz", "sha256": digest}


def _seed_as_nobody(world: Path, blobs: list[dict[str, object]]) -> dict[str, object]:
    return agent.seed({"root": str(world / "b" / "cache"), "tmp_root": str(world / "b" / "tmp"),
                       "user": "nobody", "blobs": blobs}, {})


def test_a_seed_is_unpacked_as_the_service_user_and_owned_by_it(world: Path) -> None:
    _nobody_dir(world / "b" / "cache")
    part = _blob(world / "seed", [(GRAPHS, None), (GRAPHS + "/rank_0_0/x.py", b"graph")])
    assert _seed_as_nobody(world, [part]) == {"ok": True, "seeded": [GRAPHS], "kept": []}
    made = world / "b" / "cache" / GRAPHS / "rank_0_0" / "x.py"
    assert made.read_bytes() == b"graph"
    for p in (made, made.parent, made.parent.parent, made.parent.parent.parent):
        assert p.stat().st_uid == NOBODY.pw_uid, p


def test_the_service_user_swapping_the_stage_for_a_link_never_gets_roots_files(
        world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """33.1: the stage renamed mid-unpack and a link to a root directory put in its place;
    the old code then chowned the link's tree (/etc/shadow's stand-in) to the user."""
    _nobody_dir(world / "b" / "cache")
    victim = world / "etc"
    victim.mkdir()
    (victim / "shadow").write_text("root:x")
    (victim / "shadow").chmod(0o600)
    part = _blob(world / "seed", [(GRAPHS, None), (GRAPHS + "/a.py", b"a"),
                                  (GRAPHS + "/sub/b.py", b"b")])
    copy = shutil.copyfileobj

    def swap(src: Any, dst: Any, *a: Any) -> None:
        parent = world / "b" / "cache" / "torch_compile_cache"
        for stage in parent.glob(".vigil-seed-*"):
            if not stage.is_symlink():
                stage.rename(parent / "moved")
                stage.symlink_to(victim)
        copy(src, dst, *a)

    monkeypatch.setattr(shutil, "copyfileobj", swap)
    try:
        res: dict[str, Any] | None = _seed_as_nobody(world, [part])
    except Exception:  # the old code raised after the chown
        res = None
    assert (victim / "shadow").stat().st_uid == 0 and (victim / "shadow").read_text() == "root:x"
    assert sorted(p.name for p in victim.iterdir()) == ["shadow"]
    assert res is not None and res["seeded"] == [] and GRAPHS in res["warning"]


def test_a_symlinked_parent_never_lists_or_packs_a_root_only_folder(world: Path) -> None:
    """33.3: ``torch_compile_cache -> /rootonly`` with a hex child packed root's 0600 file."""
    root = _nobody_dir(world / "a" / "cache")
    rootonly = world / "rootonly" / ("ab" * 16)
    rootonly.mkdir(parents=True)
    (rootonly / "secret").write_text("root's")
    (rootonly / "secret").chmod(0o600)
    (root / "torch_compile_cache").symlink_to(world / "rootonly")
    os.lchown(root / "torch_compile_cache", NOBODY.pw_uid, NOBODY.pw_gid)
    req = {"root": str(root), "tmp_root": str(world / "a" / "tmp"), "user": "nobody"}
    entry = "torch_compile_cache/" + "ab" * 16
    assert agent.cache_list(req) == {"entries": []}
    assert agent.cache_entries({**req, "names": True}) == []
    packed = agent.cache_pack({**req, "entries": [entry]})
    assert packed["blobs"] == [] and not list((world / "seed").iterdir())


def test_an_entry_with_a_root_only_file_inside_is_not_packed_for_others(world: Path) -> None:
    """What the service user cannot read is never in a pack, whatever root can read."""
    root = _nobody_dir(world / "a" / "cache")
    entry = _nobody_dir(root / GRAPHS)
    (entry / "mine.py").write_text("x")
    os.chown(entry / "mine.py", NOBODY.pw_uid, NOBODY.pw_gid)
    (entry / "roots").write_text("secret")
    (entry / "roots").chmod(0o600)
    req = {"root": str(root), "tmp_root": str(world / "a" / "tmp"), "user": "nobody"}
    packed = agent.cache_pack({**req, "entries": [GRAPHS]})
    assert packed["blobs"] == [] and "PermissionError" in packed["warning"]


@pytest.mark.parametrize("make, why", [
    (lambda d: _upload(d, b"not a gzip at all"), "not a packed cache"),
    (lambda d: _blob(d, [(GRAPHS, None), (GRAPHS + "/x", b"1"), (GRAPHS + "/x", b"2")]),
     "twice"),
    (lambda d: {**_blob(d, [(GRAPHS, None)]),
                "entry": "torch_compile_cache/../../../../etc/" + "a" * 10},
     "not a cache entry"),
])
def test_a_bad_seed_seeds_that_entry_not_with_one_warning_and_never_fails(
        world: Path, make: Any, why: str) -> None:
    """33.7: a non-gzip blob, a duplicate member, an entry that climbs out: the others
    still seed, the host starts cold on that one, the reply is ok."""
    _nobody_dir(world / "b" / "cache")
    good = _blob(world / "seed", [(AOT, None), (AOT + "/model", b"aot")])
    good["entry"] = AOT
    res = _seed_as_nobody(world, [make(world / "seed"), good])
    assert res["ok"] and res["seeded"] == [AOT] and why in str(res["warning"])
    assert not (world / "etc").exists() and not (world / "b" / "cache" / GRAPHS).exists()


def test_a_decompression_bomb_is_refused_from_its_listing_before_a_byte_is_written(
        world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """33.8: a 3 MB blob that unpacks to GiBs: the part's own size (from its harvest) bounds
    it, a ceiling bounds a part that claims none, and the free space is checked first."""
    _nobody_dir(world / "b" / "cache")
    big = [(GRAPHS, None), (GRAPHS + "/zeros", b"\0" * 200_000)]
    res = _seed_as_nobody(world, [{**_blob(world / "seed", big), "bytes_raw": 1000}])
    assert res["seeded"] == [] and "more than 1000 bytes" in str(res["warning"])
    monkeypatch.setattr(agent, "UNPACK_MAX_BYTES", 50_000)
    res = _seed_as_nobody(world, [_blob(world / "seed", big)])
    assert "more than 50000 bytes" in str(res["warning"])
    monkeypatch.setattr(agent, "UNPACK_MAX_BYTES", 1 << 40)
    monkeypatch.setattr(agent, "FREE_MARGIN", 1 << 60)
    res = _seed_as_nobody(world, [_blob(world / "seed", big)])
    assert "free under" in str(res["warning"])
    assert not list((world / "b" / "cache" / "torch_compile_cache").iterdir())


# -- who may seed whom (issue 33.2, 33.11) ------------------------------------------------


def test_a_kept_cache_runs_only_where_its_source_is_trusted() -> None:
    listed = seed.Trust({"h2": frozenset({"h1"}), "h1": frozenset({"h1"}),
                         "h3": frozenset()}, canary="h2")
    assert listed.refuses("h2", _manifest(source="h1", trust="listed")) is None
    why = listed.refuses("h2", _manifest(source="hostile", trust="listed"))
    assert why == "hostile is not a seed source of h2 (cache_seed_from: h1)"
    assert "cache_seed_from: none" in str(listed.refuses("h3", _manifest(source="h1")))
    # a host's own start is kept for others only when its own list names it
    assert listed.keeps("h1") == "listed" and listed.keeps("h2") is None  # canary or not
    assert listed.keeps("h3") is None
    canary = seed.Trust({"h1": None, "h2": None}, canary="h1")
    assert canary.keeps("h1") == "canary" and canary.keeps("h2") is None
    assert "not this rollout's canary (h1)" in canary.why_not_kept("h2")
    assert canary.refuses("h2", _manifest(source="h1", trust="canary")) is None
    # a cache kept before anyone asked whose it is: never run
    assert "never marked a seed source" in str(canary.refuses("h2", _manifest(trust="")))


def test_cache_seed_from_names_groups_and_hosts_and_a_wrong_name_says_where(
        tmp_path: Path) -> None:
    ts = _targets(tmp_path, """all:
  vars: {cache_seed_from: [canaries, gpu-9]}
  children:
    canaries: {hosts: {gpu-1: {address: a.invalid, model: tiny-cpu}}}
    rest: {hosts: {gpu-2: {address: b.invalid, model: tiny-cpu},
                   gpu-9: {address: c.invalid, model: tiny-cpu}}}
""")
    inv = inventory.load(tmp_path / "inventory")
    trust = seed.trust_of(list(ts.values()), inv.select)
    assert trust.sources == {h: frozenset({"gpu-1", "gpu-9"}) for h in ts}
    (tmp_path / "inventory" / "hosts.yml").write_text(
        "hosts:\n  gpu-1: {address: a.invalid, model: tiny-cpu, cache_seed_from: [gpu-7]}\n")
    inv = inventory.load(tmp_path / "inventory")
    with pytest.raises(ConfigError, match="gpu-1's cache_seed_from: 'gpu-7'") as err:
        seed.trust_of(resolve(inv, "all", operator_env={}, require_secrets=False), inv.select)
    assert err.value.key == "cache_seed_from"


def test_a_plan_never_seeds_a_cache_from_a_host_that_is_no_seed_source(
        tmp_path: Path) -> None:
    (t,) = _targets(tmp_path, "hosts:\n  h2: {address: b.invalid, model: tiny-cpu}\n").values()
    store = seed.Store(tmp_path / "caches")
    m = _manifest(key=seed.key_of(seed.key_fields(t)), source="hostile", trust="canary")
    store.put(m, {})
    for p in m.parts:
        store.blob(m.key, p.blob).write_bytes(b"x")
    plan = Plan("h2", (Action(ActionKind.RESTART, "unit changed"),), True)
    said: list[str] = []
    trust = seed.Trust({"h2": frozenset({"gpu-1"})})
    assert apply_mod.plan_seed_step(t, plan, store, said.append, [], trust) == plan
    assert said == [f"compile cache of {m.describe()} not seeded: hostile is not a seed "
                    "source of h2 (cache_seed_from: gpu-1)"]
    step = apply_mod.plan_seed_step(t, plan, store, said.append, [], seed.Trust())
    assert step.actions[0].kind == ActionKind.SEED_CACHE  # the canary rule trusts it
    assert "it runs code compiled on hostile (the canary of its rollout)" in \
        step.actions[0].reason


class _HostileHost:
    """A transport of a host whose agent answers a harvest as it likes."""

    def __init__(self, claimed: int, blob: bytes) -> None:
        self.name, self.claimed, self.blob = "hostile", claimed, blob
        self.reads = 0

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            **kw: Any) -> Result:
        verb = agent_verb(command)
        if verb == "cache_list":
            reply: dict[str, Any] = {"entries": [{"path": AOT, "files": 1, "bytes": 3,
                                                  "newest": 2000.0}]}
        elif verb == "cache_pack":
            reply = {"blobs": [{"entry": AOT, "blob": "ab" * 32 + ".tar.gz", "files": 1,
                                "sha256": hashlib.sha256(self.blob).hexdigest(),
                                "bytes": self.claimed}]}
        elif verb == "cache_read":
            self.reads += '"done": true' not in stdin  # a read, not the clean-up
            reply = {"data": base64.b64encode(self.blob).decode(), "eof": True}
        else:
            raise AssertionError(verb)
        return Result(json.dumps(reply) + "\n", "", 0)


@pytest.mark.parametrize("claimed, blob, why", [
    (300 << 30, b"", "claims 322122547200 bytes"),
    (4096, os.urandom(4096), "is refused: not a packed cache"),
])
def test_the_controller_keeps_no_blob_that_is_too_big_or_no_pack_of_its_entry(
        tmp_path: Path, claimed: int, blob: bytes, why: str) -> None:
    (t,) = _targets(tmp_path, "hosts:\n  hostile: {address: h.invalid, model: tiny-cpu}\n"
                    ).values()
    store, said = seed.Store(tmp_path / "caches"), list[str]()
    host = _HostileHost(claimed, blob)
    cc = CompileCache(state="miss", seconds=1.0, hashes=(AOT.rsplit("/", 1)[1],))
    out = seed.after_start(host, t, store, _outcome("ready", "api_starting", cc, 1000.0), None,
                           [], said.append)
    assert out["kept"] is None and why in said[-1] and said[-1].startswith(
        "compile cache: not kept")
    assert store.get(seed.key_of(seed.key_fields(t))) is None
    assert not [p for p in (tmp_path / "caches").iterdir() if p.name.startswith(".incoming")]
    assert host.reads == (0 if claimed > seed.KEEP_MAX_BYTES else 1)


def test_a_kept_blob_changed_in_the_store_is_never_sent(tmp_path: Path) -> None:
    (t,) = _targets(tmp_path, "hosts:\n  h2: {address: b.invalid, model: tiny-cpu}\n").values()
    store = seed.Store(tmp_path / "caches")
    raw = b"the harvest's blob"
    part = seed.Part(AOT, hashlib.sha256(raw).hexdigest(), len(raw), 1)
    m = _manifest(parts=(part,), trust="canary")
    store.put(m, {})
    store.blob(m.key, part.blob).write_bytes(b"os.system('planted')")
    step = seed.plan_seed(m, [], root="/c", tmp="/t", user="vllm")
    assert step is not None
    host = _HostileHost(0, b"")
    with pytest.raises(HostError, match="is not the blob its harvest checked"):
        seed.upload(host, t, store, step, print)
    assert host.reads == 0


def test_a_host_that_is_no_seed_source_cannot_quarantine_a_cache_for_the_key(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 33 (minor): quarantine was decided by what any host of the key reported: a
    hostile host crashing on purpose spoiled the seed for all. Under cache_seed_from
    only a seed source's crash quarantines; another's refuses the cache for itself."""
    monkeypatch.setattr(seed, "tmp_root", lambda t: str(tmp_path / "tmp"))
    (t,) = _targets(tmp_path, """hosts:
  h9: {address: localhost, connection: local, model: tiny-cpu, service_user: root}
""").values()
    root = tmp_path / "cache"
    _cache(root)
    t = replace(t, rendered=replace(t.rendered, paths=replace(t.rendered.paths,
                                                             cache=str(root))))
    store, said = seed.Store(tmp_path / "caches"), list[str]()
    m = _manifest(key=seed.key_of(seed.key_fields(t)), source="gpu-1", trust="listed")
    store.put(m, {})
    for p in m.parts:
        store.blob(m.key, p.blob).write_bytes(b"x")
    step = seed.plan_seed(m, [], root=str(root), tmp=str(tmp_path / "tmp"), user="root")
    trust = seed.Trust({"h9": frozenset({"gpu-1"})})
    with LocalTransport("local") as tr:
        told = seed.after_start(tr, t, store, _outcome("crashed", "compiling",
                                                       CompileCache(state="hit"), 2000.0),
                                step, [AOT], said.append, trust=trust)
    kept = store.get(m.key)
    assert kept is not None and not kept.bad and kept.refused_by == ("h9",)
    assert "not seeded here again" in said[-1] and f"dropped here: {AOT}" in said[-1]
    assert told["quarantined"] is None and told["refused"].startswith("h9's start crashed")
    assert not (root / AOT).exists()
    plan = Plan("h9", (Action(ActionKind.RESTART, "unit changed"),), True)
    assert apply_mod.plan_seed_step(t, plan, store, said.append, [], trust) == plan
    assert said[-1].endswith("not seeded: h9's start crashed on it before")
    # the seed source's own crash is the key's word
    with LocalTransport("local") as tr:
        seed.after_start(tr, t, store, _outcome("crashed", "compiling",
                                                CompileCache(state="hit"), 2000.0),
                         step, [AOT], said.append,
                         trust=seed.Trust({"h9": frozenset({"gpu-1", "h9"})}))
    assert store.get(m.key) is not None and store.get(m.key).bad  # type: ignore[union-attr]


@pytest.mark.parametrize("reply", [
    {"blobs": [{"entry": AOT}]},  # no bytes, no sha256
    {"blobs": [{"entry": AOT, "bytes": "many", "sha256": "x"}]},
    {"blobs": "not a list"},
])
def test_a_malformed_pack_reply_after_a_ready_start_is_not_kept_never_a_failure(
        tmp_path: Path, reply: dict[str, Any]) -> None:
    (t,) = _targets(tmp_path, "hosts:\n  hostile: {address: h.invalid, model: tiny-cpu}\n"
                    ).values()

    class Host(_HostileHost):
        def run(self, command: str, **kw: Any) -> Result:
            if agent_verb(command) == "cache_pack":
                return Result(json.dumps(reply) + "\n", "", 0)
            return super().run(command, **kw)

    said: list[str] = []
    cc = CompileCache(state="miss", seconds=1.0, hashes=(AOT.rsplit("/", 1)[1],))
    out = seed.after_start(Host(0, b""), t, seed.Store(tmp_path / "caches"),
                           _outcome("ready", "api_starting", cc, 1000.0), None, [], said.append)
    assert out["kept"] is None and said[-1].startswith("compile cache: not kept")


@pytest.mark.parametrize("started_at", [1e300, -5.0, float("nan")])
def test_a_manifest_whose_start_is_no_time_is_ignored_with_a_warning(
        tmp_path: Path, started_at: float) -> None:
    store = seed.Store(tmp_path)
    m = _manifest(started_at=started_at)
    (tmp_path / m.key).mkdir()
    (tmp_path / m.key / "manifest.json").write_text(json.dumps(m.to_dict()))
    assert store.get(m.key) is None
    assert "is not a time" in store.warnings[0]
