"""Seeding compile caches: the key, the plan's seed step, what a ready start keeps, the
store, and the host side (list, pack, chunks, seed, drop) on real files."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from tests.agent_payload import agent
from tests.paths import REPO
from vigil.deploy import seed
from vigil.desired import inventory
from vigil.desired.targets import Target, resolve
from vigil.report import HostResult, HostStatus, Log
from vigil.tasks import deploy as deploy_task
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
    assert step.payload["blobs"] == [{"entry": AOT, "blob": "ab" * 32 + ".tar.gz",
                                      "sha256": "ab" * 32}]
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
    return {"root": str(tmp_path / host / "cache"), "tmp_root": str(tmp_path / host / "tmp")}


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
  local: {address: localhost, connection: local, model: tiny-cpu}
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
