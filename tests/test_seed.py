"""Seeding compile caches: the key, the plan's seed step, what a ready start keeps, the
store, and the host side (list, pack, chunks, seed, drop) on real files."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from tests.agent_payload import agent
from vigil.deploy import seed
from vigil.desired import inventory
from vigil.desired.targets import Target, resolve
from vigil.verify.compile_cache import CompileCache

REPO = Path(__file__).resolve().parent.parent
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
  c: {address: c.invalid, model: tiny-cpu, port: 8001, env: {VLLM_FUSED_MOE_CHUNK_SIZE: "4096"}}
  d: {address: d.invalid, model: tiny-cpu, port: 8001, env: {VLLM_LOGGING_LEVEL: DEBUG,
                                                              VLLM_CPU_KVCACHE_SPACE: "2"}}
""")
    key = {n: seed.key_of(seed.key_fields(t)) for n, t in ts.items()}
    assert key["a"] == key["b"]
    assert key["c"] != key["a"]  # vLLM hashes it: another cache
    assert key["d"] == key["a"]  # vLLM leaves logging and the KV cache size out


# -- the plan's step (pure) ---------------------------------------------------------------


def _manifest(**kw: object) -> seed.Manifest:
    base: dict[str, object] = dict(
        key="k" * 16, fields={"model": "tiny-cpu"}, source="lab1", started_at=1764662400.0,
        sha256="ab" * 32, bytes=12_300_000, files=40, entries=(AOT, GRAPHS), compile_s=47.4)
    base.update(kw)
    return seed.Manifest(**base)  # type: ignore[arg-type]


def test_the_plan_seeds_what_the_host_lacks_and_says_from_which_start() -> None:
    step = seed.plan_seed(_manifest(), [GRAPHS], root="/var/cache/vigil/vllm", user="vllm")
    assert step is not None and step.kind == "seed_cache"
    assert "lab1's ready start 2025-12-02 08:00 UTC, compiled in 47.4 s" in step.reason
    assert "12.3 MB" in step.reason and "40d4ff84fc" in step.reason
    assert "1a2b3c4d5e" not in step.reason  # the host has that one
    assert step.payload["sha256"] == "ab" * 32 and step.payload["user"] == "vllm"


@pytest.mark.parametrize("m, present", [
    (None, []),
    (_manifest(bad="lab2's start crashed in compiling after the seed"), []),
    (_manifest(), [AOT, GRAPHS]),
])
def test_no_seed_without_a_good_cache_the_host_lacks(m: seed.Manifest | None,
                                                     present: list[str]) -> None:
    assert seed.plan_seed(m, present, root="/c", user="vllm") is None


def test_a_ready_start_keeps_the_entries_of_the_hashes_vllm_logged() -> None:
    listed = [{"path": AOT, "newest": 1.0}, {"path": GRAPHS, "newest": 1.0},
              {"path": "torch_compile_cache/ffffffffff", "newest": 500.0}]
    cc = CompileCache(state="miss", hashes=("40d4ff84fc" + "5" * 54,))
    assert seed.harvest_entries(listed, cc, started_at=100.0) == [AOT]
    # nothing logged: what this start wrote
    assert seed.harvest_entries(listed, CompileCache(state="miss"), 100.0) == [
        "torch_compile_cache/ffffffffff"]


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
    blob = tmp_path / "in.tar.gz"
    blob.write_bytes(b"x")
    m = _manifest()
    store.put(m, blob)
    assert store.get(m.key) == m and store.blob(m).read_bytes() == b"x"
    bad = store.quarantine(m, "lab2's start crashed in compiling after the seed", 5.0)
    assert store.get(m.key) == bad and bad.bad and bad.bad_at == 5.0
    # a newer cache replaces it, blob and all
    blob.write_bytes(b"y")
    new = _manifest(sha256="cd" * 32)
    store.put(new, blob)
    assert store.get(m.key) == new
    assert sorted(p.name for p in (tmp_path / "caches" / m.key).iterdir()) == [
        "cd" * 32 + ".tar.gz", "manifest.json"]


def test_a_damaged_manifest_is_ignored_with_a_warning_naming_it(tmp_path: Path) -> None:
    store = seed.Store(tmp_path)
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "manifest.json").write_text(json.dumps({"key": "k", "sha256": "nope"}))
    assert store.get("k") is None
    assert len(store.warnings) == 1 and "manifest.json: ignored" in store.warnings[0]


# -- the host side, on real files ---------------------------------------------------------


def _cache(root: Path) -> None:
    for rel, text in ((AOT + "/rank_0_0/model", "aot"),
                      (GRAPHS + "/rank_0_0/backbone/vllm_compile_cache.py", "graphs"),
                      ("torch_compile_cache/modelinfos/x.json", "not a hash")):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        os.utime(p, (1000.0, 1000.0))


def _carry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, entries: list[str]) -> dict:  # type: ignore[type-arg]
    """Pack on 'host a', read it out in chunks, write it to 'host b' in chunks."""
    monkeypatch.setattr(agent, "SEED_DIR", str(tmp_path / "seed-a"))
    packed = agent.cache_pack({"root": str(tmp_path / "a"), "entries": entries})
    data, off = b"", 0
    while True:
        r = agent.cache_read({"blob": packed["blob"], "offset": off, "size": 7})
        data += base64.b64decode(r["data"])
        off += 7
        if r["eof"]:
            break
    agent.cache_read({"blob": packed["blob"], "done": True})
    assert not (tmp_path / "seed-a" / packed["blob"]).exists()
    monkeypatch.setattr(agent, "SEED_DIR", str(tmp_path / "seed-b"))
    for i in range(0, len(data), 5):
        agent.cache_write({"blob": packed["blob"], "offset": i,
                           "data": base64.b64encode(data[i:i + 5]).decode()})
    return packed  # type: ignore[no-any-return]


def test_a_cache_carried_in_chunks_seeds_the_entries_the_host_lacks_and_keeps_its_own(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _cache(tmp_path / "a")
    listed = agent.cache_list({"root": str(tmp_path / "a")})["entries"]
    assert sorted(e["path"] for e in listed) == sorted([AOT, GRAPHS])  # modelinfos: no hash
    packed = _carry(monkeypatch, tmp_path, [AOT, GRAPHS])
    b = tmp_path / "b"
    (b / GRAPHS).mkdir(parents=True)
    (b / GRAPHS / "mine").write_text("the host's own")
    res = agent.seed({"root": str(b), "blob": packed["blob"], "sha256": packed["sha256"],
                      "entries": [AOT, GRAPHS], "user": "root"}, {})
    assert res == {"ok": True, "seeded": [AOT], "kept": [GRAPHS]}
    model = b / AOT / "rank_0_0" / "model"
    assert model.read_text() == "aot" and model.stat().st_mtime == 1000.0  # warm: older
    assert sorted(p.name for p in (b / GRAPHS).iterdir()) == ["mine"]  # never written over
    assert not [p for p in b.iterdir() if p.name.startswith(".vigil-seed-")]
    assert not (tmp_path / "seed-b" / packed["blob"]).exists()
    assert agent.cache_drop({"root": str(b), "entries": [AOT]}) == {"dropped": [AOT]}
    assert not (b / AOT).exists()


def test_a_checksum_mismatch_seeds_nothing_and_says_so(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _cache(tmp_path / "a")
    packed = _carry(monkeypatch, tmp_path, [AOT])
    res = agent.seed({"root": str(tmp_path / "b"), "blob": packed["blob"], "sha256": "0" * 64,
                      "entries": [AOT], "user": "root"}, {})
    assert res["ok"] and res["seeded"] == [] and "nothing seeded" in res["warning"]
    assert not (tmp_path / "b" / AOT).exists()


@pytest.mark.parametrize("member, why", [
    ("../../etc/cron.d/x", "unsafe path"),
    (AOT + "/link", "not a plain file"),
    ("torch_compile_cache/other0000/x", "outside the seeded entries"),
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
    import hashlib
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    (seed_dir / f"{digest}.tar.gz").write_bytes(buf.getvalue())
    res = agent.seed({"root": str(tmp_path / "b"), "blob": f"{digest}.tar.gz",
                      "sha256": digest, "entries": [AOT], "user": "root"}, {})
    assert res["seeded"] == [] and why in res["warning"]
    assert not (tmp_path / "etc").exists() and not (tmp_path / "b" / AOT).exists()


def test_the_agent_refuses_a_path_that_is_not_a_cache_entry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a cache entry"):
        agent.cache_drop({"root": str(tmp_path), "entries": ["../../etc"]})
    with pytest.raises(ValueError, match="not a cache blob name"):
        agent.cache_read({"blob": "../x", "offset": 0, "size": 1})
