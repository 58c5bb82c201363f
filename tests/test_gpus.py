"""GPU facts from NVML / nvidia-smi readings (fixtures composed from the documented
formats, see tests/fixtures/gpus/README.md) and the preflight refusals built on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_plan import facts_for, target
from vigil.deploy.facts import HostFacts
from vigil.deploy.gpus import GIB, MIB, GpuParseError, from_agent, parse_nvml, parse_smi
from vigil.deploy.plan import make_plan
from vigil.deploy.preflight import check_host, problems, stale_gpu_processes
from vigil.errors import HostError, RefusedError

FIX = Path(__file__).resolve().parent / "fixtures" / "gpus"
SERVICE = list(range(41001, 41009))


def nvml() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIX / "nvml_8x_rtx_pro_6000_stale.json").read_text())
    return data


def smi(name: str) -> str:
    return (FIX / name).read_text()


def test_nvml_reading() -> None:
    g = parse_nvml(nvml())
    assert (g.source, g.count, g.driver) == ("nvml", 8, "580.95.05")
    assert {x.name for x in g.gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert g.gpus[0].memory_total_bytes == 97887 * MIB
    assert g.gpus[3].memory_used_bytes == (30720 + 612 + 62464) * MIB
    assert [p.pid for p in g.gpus[3].processes] == [41004, 38817]


def test_nvidia_smi_reading_matches_nvml() -> None:
    g = parse_smi(smi("smi_query_gpu_8x.csv"), smi("smi_compute_apps_8x.csv"))
    n = parse_nvml(nvml())
    assert g.source == "nvidia-smi" and g.count == 8
    assert [(x.index, x.uuid, x.memory_total_bytes, x.memory_used_bytes) for x in g.gpus] == \
        [(x.index, x.uuid, x.memory_total_bytes, x.memory_used_bytes) for x in n.gpus]
    gpu0 = {p.pid: p for p in g.gpus[0].processes}
    assert gpu0[40990].used_bytes is None  # "[N/A]"
    assert gpu0[41001].name == "/opt/vigil/envs/current/bin/python"


def test_stale_holders_are_the_processes_outside_the_service() -> None:
    raw = {"nvml": nvml(), "cmdlines": {"38817": "VLLM::Worker_TP3"}}
    facts = facts_for(target(), gpus=raw, service_pids=SERVICE)
    (stale,) = stale_gpu_processes(facts)
    assert (stale.pid, stale.gpus, stale.used_bytes) == (38817, (3,), 62464 * MIB)
    assert stale.describe() == "pid 38817 holds 61.0 GiB on GPU 3: VLLM::Worker_TP3"
    # through nvidia-smi a process with unknown memory is a holder too
    via_smi = facts_for(target(), gpus={"nvml": None, "nvml_error": "import pynvml: No module",
                                        "smi_gpus": smi("smi_query_gpu_8x.csv"),
                                        "smi_apps": smi("smi_compute_apps_8x.csv")},
                        service_pids=SERVICE)
    assert [(s.pid, s.describe().split(": ")[0]) for s in stale_gpu_processes(via_smi)] == [
        (38817, "pid 38817 holds 61.0 GiB on GPU 3"), (40990, "pid 40990 holds ? GiB on GPU 0")]
    assert via_smi.gpus.error == "import pynvml: No module"


def test_stale_gpu_memory_is_refused_with_evidence_and_kill_stale_ends_it() -> None:
    t = target()
    facts = facts_for(t, gpus={"nvml": nvml(), "cmdlines": {"38817": "VLLM::Worker_TP3"}},
                      service_pids=SERVICE)
    with pytest.raises(RefusedError) as err:
        check_host("llm-one", t.profile, t.rendered, facts)
    text = str(err.value)
    assert "GPU memory is held by 1 process(es) outside vllm.service" in text
    assert "pid 38817 holds 61.0 GiB on GPU 3: VLLM::Worker_TP3" in text
    assert "--kill-stale" in text
    check_host("llm-one", t.profile, t.rendered, facts, kill_stale=True)  # no refusal
    plan = make_plan("llm-one", t.stack, t.rendered, facts, kill_pids=(38817,))
    kinds = [a.kind for a in plan.actions]
    assert "kill" in kinds and plan.actions[kinds.index("kill")].payload == {"pids": [38817]}
    # without --kill-stale nothing kills
    assert "kill" not in [a.kind for a in make_plan("llm-one", t.stack, t.rendered,
                                                    facts).actions]


def test_too_few_gpus_and_a_cpu_host_are_refused() -> None:
    t = target()  # glm-5: tensor_parallel_size 8
    four = nvml()
    four["gpus"] = four["gpus"][:4]
    with pytest.raises(RefusedError, match=r"= 8 GPUs; the host shows 4 \(via nvml\)"):
        check_host("llm-one", t.profile, t.rendered,
                   facts_for(t, gpus={"nvml": four}, service_pids=SERVICE))
    cpu = facts_for(t, gpus={"nvml": None, "nvml_error": "nvmlInit: Driver Not Loaded",
                             "smi_gpus": None, "smi_apps": None})
    with pytest.raises(RefusedError, match=r"shows 0 \(via none\) \(NVML: nvmlInit: Driver"):
        check_host("llm-one", t.profile, t.rendered, cpu)


def _facts(**changes: Any) -> HostFacts:
    # 38817 counted as the service's own here: these tests are about the model and the port
    return facts_for(target(), gpus={"nvml": nvml()}, service_pids=[*SERVICE, 38817], **changes)


def test_incomplete_model_and_taken_port_are_refused() -> None:
    t = target()
    missing = [f"model-{i:05d}-of-00083.safetensors" for i in (7, 8, 9, 40, 41, 82)]
    f = _facts(model={"weights": {"index": True, "listed": 83, "present": 77,
                                  "missing": missing}},
               port={"listening": True, "owners": [{"pid": 5120, "cmdline": "python3 -m "
                                                    "http.server 8000"}]})
    found = [str(e) for e in problems("llm-one", t.profile, t.rendered, f)]
    assert any("6 of 83 shards listed in model.safetensors.index.json are absent "
               "(model-00007-of-00083.safetensors" in e and "and 1 more" in e for e in found)
    assert any("port 8000 is taken by another process (pid 5120: python3 -m http.server 8000)"
               in e for e in found)
    # the service's own listener is not a conflict; an invisible one is
    own = _facts(port={"listening": True, "owners": [{"pid": 41001, "cmdline": "vllm"}]})
    assert problems("llm-one", t.profile, t.rendered, own) == []
    hidden = _facts(port={"listening": True, "owners": []})
    (e,) = problems("llm-one", t.profile, t.rendered, hidden)
    assert "not visible from the host's PID namespace" in str(e)


def test_malformed_readings_are_one_clear_error() -> None:
    with pytest.raises(GpuParseError, match="query-gpu line 1: expected 5 fields"):
        parse_smi("0, NVIDIA H100, 81559\n", None)
    with pytest.raises(GpuParseError, match=r"GPU 0 memory\.total: expected MiB, got 'lots'"):
        parse_smi("0, NVIDIA H100, GPU-1, lots, 0\n", None)
    with pytest.raises(HostError, match="llm-one: cannot read its GPUs"):
        facts_for(target(), gpus={"nvml": {"gpus": [{"memory_total": "x"}]}})
    assert from_agent(None).source == "none" and from_agent(None).count == 0
    assert round(62464 * MIB / GIB, 1) == 61.0
