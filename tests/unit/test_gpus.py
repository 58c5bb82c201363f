"""GPU facts from real published nvidia-smi / kernel-log outputs (tests/fixtures/gpus, each
with its source in the README there) and the preflight refusals built on them."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.agent_payload import agent
from tests.doubles import capture, facts_for, target
from tests.paths import FIXTURES
from vigil.deploy.gpucheck import (
    MIN_DRIVER,
    GpuPolicy,
    arch_problems,
    driver_problems,
    health_lines,
    health_problems,
    installed_arch_problems,
    newest_cuda,
    runs_on,
    visible_devices_problems,
)
from vigil.deploy.gpus import (
    MIB,
    GpuFacts,
    GpuParseError,
    from_agent,
    parse_mig_list,
    parse_nvml,
    parse_query_csv,
    parse_smi,
    parse_smi_xml,
    parse_xids,
    stale_processes,
)
from vigil.deploy.plan import make_plan
from vigil.deploy.preflight import check_host, problems, stale_gpu_processes
from vigil.desired.stacks import Stack
from vigil.errors import HostError, RefusedError
from vigil.verify.snapshot import Snapshot

FIX = FIXTURES / "gpus"


def text(name: str) -> str:
    return (FIX / name).read_text()


# vigil's own agent on a real H200 (README: h200_vigil/), idle and busy/
VIGIL = FIX / "h200_vigil"
H200_UUID = "GPU-db253080-9d12-48de-9a57-949b1a7023d0"


def recorded(name: str) -> Any:
    return json.loads((VIGIL / name).read_text())


def smi_only(raw: dict[str, Any]) -> dict[str, Any]:
    """The same reading as a host without nvidia-ml-py sends it: nvidia-smi's CSV only."""
    return {**raw, "nvml": None, "nvml_error": "import pynvml: No module named 'pynvml'"}


# name, GPUs, driver, sm, MiB total, MiB used (GPU 0), persistence, MIG, MIG devices,
# processes on GPU 0, first process's MiB (None: "[N/A]")
CAPTURES = [
    ("h100", 1, "590.48.01", "sm_90", 81559, 19818, True, False, 0, 3, 2566),
    ("h100_mig", 1, "590.48.01", "sm_90", 81559, 11125, True, True, 4, 3, 2296),
    ("h200", 1, "590.48.01", "sm_90", 143771, 32362, True, False, 0, 3, 2566),
    ("h200_mig", 1, "590.48.01", "sm_90", 143771, 16959, True, True, 5, 3, 2194),
    ("l40s", 1, "595.80", "sm_89", 46068, 1235, False, None, 0, 2, 538),
    ("rtx4080super", 1, "595.71.05", "sm_89", 16376, 1474, False, None, 0, 3, 25),
    ("rtx2080super_r610", 1, "610.57.04", "sm_75", 8192, 815, False, None, 0, 2, 370),
    ("rtx2080super_wddm", 1, "610.62", "sm_75", 8192, 1366, None, None, 0, 21, None),
    ("rtx_pro_6000_x9", 9, "580.65.06", "sm_120", 97887, 0, None, None, 0, 0, None),
    ("b200_x8", 8, None, "sm_100", 0, 0, None, None, 0, 0, None),
    # vigil's own recording on a lent H200, idle and with a torch process holding 6 GiB
    ("h200_vigil", 1, "580.159.04", "sm_90", 143771, 0, True, False, 0, 0, None),
    ("h200_vigil/busy", 1, "580.159.04", "sm_90", 143771, 6835, True, False, 0, 1, 6826),
]


@pytest.mark.parametrize(("name", "count", "driver", "sm", "total", "used", "persistence",
                          "mig", "mig_devices", "procs", "first_mib"), CAPTURES)
def test_every_real_capture_parses(name: str, count: int, driver: str | None, sm: str,
                                   total: int, used: int, persistence: bool | None,
                                   mig: bool | None, mig_devices: int, procs: int,
                                   first_mib: int | None) -> None:
    g = from_agent(capture(name))
    assert (g.source, g.count, g.driver) == ("nvidia-smi", count, driver)
    assert [x.index for x in g.gpus] == list(range(count))
    gpu = g.gpus[0]
    assert (gpu.sm, gpu.memory_total_bytes, gpu.memory_used_bytes) == (sm, total * MIB,
                                                                      used * MIB)
    assert (gpu.persistence, gpu.mig, len(gpu.mig_devices)) == (persistence, mig, mig_devices)
    assert len(gpu.processes) == procs
    if procs:
        first = gpu.processes[0]
        assert first.used_bytes == (None if first_mib is None else first_mib * MIB)
    assert g.error == "import pynvml: No module named 'pynvml'"


def test_health_fields_of_the_datacenter_captures() -> None:
    h100 = from_agent(capture("h100")).gpus[0]
    assert (h100.ecc_uncorrected, h100.retired_pages_pending, h100.remap_pending,
            h100.remap_failure, h100.bus_id) == (0, None, False, False, "00000000:00:09.0")
    # in MIG mode the driver reports no remap state: unknown, not "no"
    assert from_agent(capture("h100_mig")).gpus[0].remap_pending is None
    # consumer cards have no ECC: unknown
    assert from_agent(capture("rtx4080super")).gpus[0].ecc_uncorrected is None


def test_mig_instances_from_nvidia_smi_list() -> None:
    h100 = parse_mig_list(text("h100_mig/list.txt"))
    assert [m.profile for m in h100[0]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert h100[0][0].uuid == "MIG-00000000-0000-0000-0000-000000000000"
    h200 = parse_mig_list(text("h200_mig/list.txt"))
    assert [m.profile for m in h200[0]] == ["1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb",
                                            "1g.18gb"]
    assert parse_mig_list(text("h100/list.txt")) == {0: ()}


def test_a_process_name_with_a_comma_and_a_windows_path_survive() -> None:
    rows = parse_query_csv(text("rtx2080super_wddm/compute_apps.csv"), "compute-apps")
    assert rows[0]["used_gpu_memory"] == "[N/A]"
    assert rows[0]["process_name"] == r"C:\Windows\System32\dwm.exe"
    odd = ("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
           "GPU-1, 7, python -c a, b, 12 MiB\n")
    assert parse_query_csv(odd, "x")[0]["process_name"] == "python -c a, b"


def test_xml_readings() -> None:
    pro = parse_smi_xml(text("rtx_pro_6000_maxq.xml"))
    (g,) = pro.gpus
    assert (pro.driver, pro.cuda, g.name) == (
        "590.44.01", "13.1", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition")
    assert (g.memory_total_bytes, g.memory_used_bytes) == (97887 * MIB, 65720 * MIB)
    assert (g.persistence, g.mig, g.remap_pending, g.remap_failure) == (True, None, False, False)
    # schema v13's Blackwell repair fields under <ecc_errors>: "No", "No", "N/A"
    assert (g.channel_repair_pending, g.tpc_repair_pending, g.unrepairable_memory) == (
        False, False, None)
    (h200,) = parse_smi_xml(text("h200_vigil/smi.xml")).gpus  # the same fields, all "No"
    assert (h200.channel_repair_pending, h200.tpc_repair_pending,
            h200.unrepairable_memory) == (False, False, False)
    assert [(p.pid, p.used_bytes, p.name) for p in g.processes] == [
        (116860, 65710 * MIB, "/root/src/llama.cpp/build/bin/llama-server")]
    a100 = parse_smi_xml(text("a100_sxm4.xml"))
    (g,) = a100.gpus
    assert (a100.driver, g.mig, g.ecc_uncorrected, g.bus_id) == (
        "535.54.03", True, 0, "00000000:01:00.0")
    assert [m.memory_total_bytes for m in g.mig_devices] == [19968 * MIB] * 4
    mig = parse_smi_xml(text("a100_sxm4_mig.xml")).gpus[0]
    assert (mig.mig, len(mig.mig_devices), mig.ecc_uncorrected) == (True, 2, None)  # N/A


def test_kernel_log_xid_events() -> None:
    events = parse_xids(text("kernel/dmesg_ctime_xid13_xid109.txt"))
    assert [(e.pci, e.code) for e in events] == [("0000:cb:00", 13)] * 3 + [("0000:cb:00", 109)]
    assert events[-1].time == datetime(2024, 8, 30, 11, 43, 14)
    nvlink = parse_xids(text("kernel/kmsg_nvlink_xid149_xid145.txt"))
    assert [(e.pci, e.code, e.time) for e in nvlink] == [
        ("0019:01:00", 149, None), ("0000:00:00", 149, None), ("0018:01:00", 145, None)]
    # the agent reads journalctl -k -o short-iso: the same real line behind that prefix
    line = text("kernel/dmesg_ctime_xid13_xid109.txt").splitlines()[-1].split("] ", 1)[1]
    (iso,) = parse_xids(f"2024-08-30T11:43:14+0200 node kernel: {line}")
    assert iso.time is not None and iso.time.utcoffset() == timedelta(hours=2)
    # a GPU that fell off the bus without an Xid line is Xid 79, matched to its GPU
    h100 = from_agent(capture("h100")).gpus[0]
    gpu_b3 = replace(h100, index=5, bus_id="00000000:B3:00.0")
    (fallen,) = parse_xids(text("kernel/dmesg_fallen_off_bus_no_xid.txt"), [h100, gpu_b3])
    assert (fallen.code, fallen.gpu, fallen.pci) == (79, 5, "0000:b3:00.0")


def test_malformed_readings_are_one_clear_error() -> None:
    with pytest.raises(GpuParseError, match="first line is not a CSV header"):
        parse_smi("0, NVIDIA H100, GPU-1, 81559, 0\n")
    with pytest.raises(GpuParseError, match="query-gpu line 2: expected 3 fields"):
        parse_smi("index, name, memory.total\n0, NVIDIA H100\n")
    with pytest.raises(GpuParseError, match=r"GPU 0 memory\.total: expected MiB, got 'lots'"):
        parse_smi("index, name, memory.total [MiB]\n0, NVIDIA H100, lots\n")
    with pytest.raises(GpuParseError, match="not XML"):
        parse_smi_xml("<nvidia_smi_log><gpu>")
    with pytest.raises(HostError, match="llm-one: cannot read its GPUs"):
        facts_for(target(), gpus={"nvml": {"gpus": [{"memory_total": "x"}]}})
    assert from_agent(None).source == "none" and from_agent(None).count == 0


# -- the agent, with nvidia-smi replaying real outputs ---------------------------------

FAKE_SMI = """#!/bin/sh
# replays a recorded nvidia-smi output per command (tests/fixtures/gpus)
case "$1" in
  --query-gpu=*compute_cap*) [ -n "$OLD_DRIVER" ] && { echo "$OLD_DRIVER"; exit 2; }
                             cat "$FIX/query_gpu.csv" ;;
  --query-gpu=*) cat "$FIX/query_gpu_base.csv" ;;
  --query-compute-apps=*) cat "$FIX/compute_apps.csv" ;;
  -L) cat "$FIX/list.txt" ;;
  -q) cat "$FIX/smi.xml" ;;
  *) exit 9 ;;
esac
"""


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    data = tmp_path / "data"
    data.mkdir()
    for f in (FIX / name).iterdir():
        (data / f.name).write_text(f.read_text())
    # the plain fields of the same recorded rows (nvidia-smi projects any field subset)
    rows = parse_query_csv(text(f"{name}/query_gpu.csv"), "x")
    fields = agent.SMI_FACT_FIELDS.split(",")
    units = {"memory.total": " [MiB]", "memory.used": " [MiB]"}
    (data / "query_gpu_base.csv").write_text(
        ", ".join(f + units.get(f, "") for f in fields) + "\n"
        + "".join(", ".join(r[f] for f in fields) + "\n" for r in rows))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FIX", str(data))
    return data


def test_agent_reads_nvidia_smi_by_field_name(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, monkeypatch, "h100_mig")
    raw = agent.gpu_facts(str(tmp_path / "no-env" / "python"))
    g = from_agent(raw)
    assert (g.source, g.driver, g.gpus[0].sm, len(g.gpus[0].mig_devices)) == (
        "nvidia-smi", "590.48.01", "sm_90", 4)
    assert sorted(raw["cmdlines"]) == ["21180", "21181", "21198"]
    assert "smi_xml" not in raw


def test_an_old_driver_rejecting_a_field_gets_plain_fields_and_the_xml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = fake_smi(tmp_path, monkeypatch, "h100")
    (data / "smi.xml").write_text(text("a100_sxm4_mig.xml"))
    # the message a 470 driver prints (huggingface/candle#733)
    monkeypatch.setenv("OLD_DRIVER", 'Field "compute_cap" is not a valid field to query.')
    raw = agent.gpu_facts(str(tmp_path / "no-env" / "python"))
    assert raw["smi_xml"] is not None
    g = from_agent(raw)
    # identity from the CSV; health filled from the XML where the CSV had none
    assert (g.gpus[0].name, g.gpus[0].sm, g.gpus[0].mig) == ("NVIDIA H100 80GB HBM3", None, True)


# -- stale holders -----------------------------------------------------------------------


def test_stale_holders_from_real_process_lists() -> None:
    # the H100 capture under load: gpu_burn (as "the service") and two memhogs beside it
    facts = facts_for(target(), gpus=capture("h100"), service_pids=[11345])
    assert [s.describe() for s in stale_gpu_processes(facts)] == [
        "pid 11327 holds 2.5 GiB on GPU 0: (command unknown)",
        "pid 11328 holds 1.5 GiB on GPU 0: (command unknown)"]
    # WDDM reports no per-process memory: "[N/A]" is a holder of unknown size
    wddm = facts_for(target(), gpus=capture("rtx2080super_wddm"), service_pids=[])
    assert stale_gpu_processes(wddm)[0].describe().startswith("pid 2140 holds ? GiB on GPU 0")


def test_stale_gpu_memory_is_refused_and_kill_stale_allows_it() -> None:
    t = target()
    eight = capture("h100")
    facts = facts_for(t, gpus=eight, service_pids=[11345])
    found = [str(e) for e in problems("llm-one", t.profile, t.rendered, facts)]
    assert any("GPU memory is held by 2 process(es) outside vllm.service" in e for e in found)
    assert not any("held by" in str(e) for e in problems(
        "llm-one", t.profile, t.rendered, facts, kill_stale=True))


# -- the stack fits the hardware ----------------------------------------------------------

TORCH_26_CU124 = Stack(
    name="old-torch", packages={"vllm": "0.8.5", "torch": "2.6.0+cu124"}, cuda="12.4",
    # torch's own list on an RTX PRO 6000 (xorbitsai/inference#3866)
    gpu_archs={"torch": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]})


def test_sm120_gpus_and_a_torch_without_sm120_kernels_are_refused() -> None:
    gpus = from_agent(capture("rtx_pro_6000_x9"))
    (err,) = arch_problems("llm-one", TORCH_26_CU124, list(gpus.gpus))
    assert str(err.message) == (
        "llm-one: GPU 0..8 are sm_120 (NVIDIA RTX PRO 6000 Blackwell Server Edition); torch "
        "2.6.0+cu124, CUDA 12.4 has kernels up to sm_90 (sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 "
        "sm_90)")
    assert "pin a torch build that carries sm_120" in str(err) and "cu128+" in str(err)
    # the repo's Blackwell stack carries sm_100 and sm_120: B200 and RTX PRO 6000 both fit
    t = target()
    assert t.stack.cuda == "12.9" and "sm_120" in t.stack.gpu_archs["torch"]
    for name in ("rtx_pro_6000_x9", "b200_x8", "h100", "l40s"):
        assert arch_problems("h", t.stack, list(from_agent(capture(name)).gpus)) == [], name


def test_architecture_compatibility_rules() -> None:
    assert runs_on(["sm_80"], "sm_89")          # same major, newer minor: SASS runs
    assert not runs_on(["sm_90"], "sm_100")     # no SASS across majors
    assert runs_on(["compute_90"], "sm_120")    # PTX is JIT-compiled for newer GPUs
    assert not runs_on(["compute_100"], "sm_90")
    assert runs_on(["sm_90a"], "sm_90") and not runs_on(["sm_100a"], "sm_120")


def test_a_driver_older_than_the_stacks_cuda_is_refused() -> None:
    gpus = from_agent(capture("rtx_pro_6000_x9"))  # driver 580.65.06
    cu131 = TORCH_26_CU124.model_copy(update={"cuda": "13.1"})
    (err,) = driver_problems("llm-one", cu131, gpus)
    assert str(err.message) == ("llm-one: driver 580.65.06 (its newest CUDA is 13.0) is older "
                                "than 590.44.01, the minimum for CUDA 13.1, which stack "
                                "old-torch is built for")
    assert driver_problems("llm-one", target().stack, gpus) == []  # 12.9 needs 575.51.03
    # a CUDA newer than the table asks for at least the newest known driver
    future = TORCH_26_CU124.model_copy(update={"cuda": "13.9"})
    assert "older than 590.44.01" in str(driver_problems("h", future, gpus)[0])
    assert list(MIN_DRIVER) == sorted(MIN_DRIVER, key=lambda v: tuple(map(int, v.split("."))))


def test_the_newest_cuda_comes_from_the_driver_table_when_nvidia_smi_csv_omits_it() -> None:
    from dataclasses import replace

    from vigil.deploy.gpucheck import newest_cuda
    # the real XML reports say it themselves; the table agrees for drivers it covers
    for xml, said in (("a100_sxm4.xml", "12.2"), ("rtx_pro_6000_maxq.xml", "13.1")):
        read = from_agent({"smi_xml": text(xml)})
        assert newest_cuda(read) == read.cuda == said
        assert newest_cuda(replace(read, cuda=None)) == said
    # the CSV captures carry no CUDA field: the table answers from the driver version
    assert from_agent(capture("rtx_pro_6000_x9")).cuda is None
    assert newest_cuda(from_agent(capture("rtx_pro_6000_x9"))) == "13.0"  # 580.65.06
    assert newest_cuda(from_agent(capture("h100"))) == "13.1"  # 590.48.01
    # older than the table, or no driver read: unknown, never guessed
    assert newest_cuda(replace(from_agent(capture("h100")), driver="510.47.03")) is None
    assert newest_cuda(from_agent(capture("b200_x8"))) is None


def test_cuda_visible_devices_naming_absent_gpus_is_refused() -> None:
    gpus = from_agent(capture("rtx_pro_6000_x9"))
    (err,) = visible_devices_problems("llm-one", {"CUDA_VISIBLE_DEVICES": "0,1,12"}, gpus)
    assert "CUDA_VISIBLE_DEVICES=0,1,12 names 12, which the host does not have (GPUs 0..8" \
        in str(err)
    assert visible_devices_problems("h", {"CUDA_VISIBLE_DEVICES": "8,0"}, gpus) == []
    mig = from_agent(capture("h100_mig"))
    uuid = mig.gpus[0].mig_devices[1].uuid or ""
    assert visible_devices_problems("h", {"CUDA_VISIBLE_DEVICES": uuid}, mig) == []
    # through preflight: the profile's env reaches r.env
    t = target("env={'CUDA_VISIBLE_DEVICES': '0,1,2,3,4,5,6,9'}")
    eight = capture("b200_x8")
    found = problems("llm-one", t.profile, t.rendered, facts_for(t, gpus=eight),
                     stack=t.stack)
    assert any("names 9" in str(e) for e in found)


# -- health -------------------------------------------------------------------------------


def test_mig_mode_is_refused_with_the_instances_and_policy_can_allow_it() -> None:
    gpus = from_agent(capture("h100_mig"))
    (err,) = health_problems("llm-one", gpus, GpuPolicy(), need=1)
    assert ("MIG is enabled (GPU 0: 4 instance(s) (3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb)); a "
            "CUDA process sees one MIG instance") in str(err)
    assert health_problems("llm-one", gpus, GpuPolicy(refuse_mig=False), need=1) == []
    lines = health_lines(gpus, GpuPolicy())
    assert lines[0] == ("GPU 0: sm_90; persistence on; MIG on; ECC uncorrected 0; pending: "
                        "none; 4 MIG instance(s): 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb")
    assert lines[-1] == "Xid events: kernel log not read"


def test_ecc_and_pending_remaps_are_refused() -> None:
    # No published CSV/XML with these set was found (README): one field of the real H100
    # reading is flipped to what the driver prints then.
    real = from_agent(capture("h100"))
    assert health_problems("h", real, GpuPolicy(), need=1) == []
    bad = replace(real, gpus=(replace(real.gpus[0], ecc_uncorrected=4, remap_pending=True),))
    ecc, remap = health_problems("h", bad, GpuPolicy(), need=1)
    assert "uncorrectable ECC errors since the driver loaded: GPU 0: 4" in str(ecc)
    assert "GPU 0: row remap pending" in str(remap)
    assert health_problems("h", bad, GpuPolicy(refuse_ecc_uncorrected=False,
                                               refuse_pending_retirement=False), need=1) == []
    persist = from_agent(capture("l40s"))  # persistence mode off
    assert health_problems("h", persist, GpuPolicy(), need=1) == []
    (off,) = health_problems("h", persist, GpuPolicy(require_persistence=True), need=1)
    assert "persistence mode is off on GPU 0" in str(off)


def test_pending_blackwell_repairs_and_unrepairable_memory_are_refused() -> None:
    # No published reading with these set was found: one field of the real RTX PRO 6000
    # XML (schema v13) is flipped to "Yes", what the driver prints then.
    real = text("rtx_pro_6000_maxq.xml")
    assert health_problems("h", parse_smi_xml(real), GpuPolicy(), need=1) == []
    for field, shown in (("channel_repair_pending", "channel repair pending"),
                         ("tpc_repair_pending", "TPC repair pending")):
        flipped = real.replace(f"<{field}>No</{field}>", f"<{field}>Yes</{field}>")
        assert flipped != real
        gpus = parse_smi_xml(flipped)
        (err,) = health_problems("llm-one", gpus, GpuPolicy(), need=1)
        assert f"llm-one: GPU 0: {shown}" in str(err)
        assert "reset the GPU (nvidia-smi -r -i N)" in str(err)
        assert f"pending: {shown.removesuffix(' pending')}" in health_lines(
            gpus, GpuPolicy())[0]
        assert health_problems("llm-one", gpus, GpuPolicy(refuse_pending_retirement=False),
                               need=1) == []
    broken = real.replace("<unrepairable_memory>N/A</unrepairable_memory>",
                          "<unrepairable_memory>Yes</unrepairable_memory>")
    assert broken != real
    gpus = parse_smi_xml(broken)
    (err,) = health_problems("llm-one", gpus, GpuPolicy(), need=1)
    assert "llm-one: GPU 0: unrepairable memory" in str(err)
    assert "replace the GPU (RMA)" in str(err)
    assert "unrepairable memory" in health_lines(gpus, GpuPolicy())[0]
    # the agent's CSV has no repair field: the XML of the same reading fills it (the real
    # H200 recording, its smi.xml flipped the same way)
    h200 = text("h200_vigil/smi.xml").replace("<tpc_repair_pending>No</tpc_repair_pending>",
                                              "<tpc_repair_pending>Yes</tpc_repair_pending>")
    both = from_agent({"smi_gpus": text("h200_vigil/query_gpu.csv"), "smi_xml": h200})
    assert (both.source, both.gpus[0].tpc_repair_pending) == ("nvidia-smi", True)
    (err,) = health_problems("h200", both, GpuPolicy(), need=1)
    assert "h200: GPU 0: TPC repair pending" in str(err)


def test_recent_xid_events_are_refused_old_ones_only_shown() -> None:
    base = from_agent(capture("h100"))
    log = text("kernel/dmesg_ctime_xid13_xid109.txt") + text(
        "kernel/dmesg_fallen_off_bus_no_xid.txt")
    raw = {**capture("h100"), "kernel": log, "kernel_source": "dmesg",
           "now": "2024-08-30T12:00:00+00:00"}
    gpus = from_agent(raw)
    assert [e.code for e in gpus.xids] == [13, 13, 13, 109, 79]
    (err,) = health_problems("llm-one", gpus, GpuPolicy(), need=1)
    # 13 and 109 are application faults (shown); 79 has no time, so it counts as recent
    assert "1 Xid event(s) in the last 24 h (dmesg)" in str(err)
    assert "NVRM: The NVIDIA GPU 0000:b3:00.0" in str(err)
    only_old = from_agent({**raw, "kernel": text("kernel/dmesg_ctime_xid13_xid109.txt"),
                           "now": "2024-09-02T12:00:00+00:00"})
    strict = GpuPolicy(refuse_xids=frozenset({13, 109}))
    assert health_problems("h", only_old, strict, need=1) == []  # 3 days old
    (recent,) = health_problems("h", replace(only_old, now=datetime(2024, 8, 30, 12, 0)),
                                strict, need=1)
    assert "4 Xid event(s)" in str(recent)
    assert health_lines(gpus, GpuPolicy())[-1] == (
        "Xid events in the last 24 h (dmesg): 5 (Xid 13, 79, 109)")
    assert base.kernel_log is None


def test_policy_comes_from_the_host_variables() -> None:
    t = target("gpu_refuse_mig=false", "gpu_xid_window_h=72", "gpu_refuse_xids=[79]")
    policy = GpuPolicy.of(t.vars)
    assert (policy.refuse_mig, policy.xid_window, policy.refuse_xids) == (
        False, timedelta(hours=72), frozenset({79}))
    assert GpuPolicy.of(target().vars) == GpuPolicy()


def test_preflight_refuses_an_unfit_host_with_its_evidence() -> None:
    t = target()
    facts = facts_for(t, gpus=capture("h100_mig"))
    old = t.stack.model_copy(update={"cuda": "13.1"})
    with pytest.raises(RefusedError) as err:
        check_host("llm-one", t.profile, t.rendered, facts, stack=old, kill_stale=True)
    # first refusal met: too few GPUs (8 needed); the GPU checks follow in problems()
    assert "the host shows 1" in str(err.value)
    found = [str(e) for e in problems("llm-one", t.profile, t.rendered, facts, stack=old,
                                      kill_stale=True)]
    assert any("MIG is enabled" in e and "8 GPU(s)" in e for e in found)
    assert not any("driver" in e for e in found)  # 590.48.01 >= 590.44.01
    # without a stack (older callers) nothing GPU-specific beyond the count is judged
    assert not any("MIG" in str(e) for e in problems("llm-one", t.profile, t.rendered, facts))


def test_installed_torch_arch_list_is_checked_and_cpu_builds_skip() -> None:
    stack = target().stack
    good = {"torch_cuda": {"available": True, "cuda": "12.8", "capabilities": [[12, 0]],
                           "archs": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                     "sm_120"]}}
    assert installed_arch_problems(stack, good) == []
    old = {"torch_cuda": {"available": True, "cuda": "12.4", "capabilities": [[12, 0]],
                          "archs": TORCH_26_CU124.gpu_archs["torch"]}}
    first, second = installed_arch_problems(stack, old)
    assert "has no kernels for this host's sm_120 GPUs" in first
    assert "lacks sm_100, sm_120, which stack vllm-0.16-nightly states" in second
    for cpu in ({"torch_cuda": {"available": False, "cuda": None, "archs": []}},
                {"torch_cuda": None}, {}):
        assert installed_arch_problems(stack, cpu) == []


def test_stack_arch_fields_are_validated() -> None:
    with pytest.raises(ValueError, match="'sm90' is not an architecture"):
        Stack(name="s", packages={"torch": "2.10.0"}, gpu_archs={"torch": ["sm90"]})
    with pytest.raises(ValueError, match="gpu_archs names 'flashinfer-python'"):
        Stack(name="s", packages={"torch": "2.10.0"}, gpu_archs={"flashinfer-python": []})
    with pytest.raises(ValueError, match="cuda"):
        Stack(name="s", packages={"torch": "2.10.0"}, cuda="cu129")
    # stated, verified, not installed: the environment's content hash does not move
    plain = Stack(name="s", packages={"torch": "2.10.0"})
    stated = Stack(name="s", packages={"torch": "2.10.0"}, cuda="12.9",
                   gpu_archs={"torch": ["sm_90"]})
    assert plain.model_dump() == stated.model_dump()


def test_nvml_reading_with_compute_capability() -> None:
    # the agent's real NVML reading (h200_vigil): cc [9, 0], cuda_driver 13000
    nvml = recorded("agent_gpu_facts.json")["nvml"]
    g = parse_nvml(nvml)
    assert (g.source, g.cuda, g.gpus[0].sm, g.gpus[0].compute_cap) == (
        "nvml", "13.0", "sm_90", "9.0")
    # nvmlSystemGetCudaDriverVersion is major * 1000 + minor * 10: other drivers' values
    for value, cuda in ((12080, "12.8"), (13010, "13.1"), (11040, "11.4")):
        assert parse_nvml({**nvml, "cuda_driver": value}).cuda == cuda
    # older bindings without the call: no cc, no sm, nothing guessed
    (gpu,) = parse_nvml({**nvml, "gpus": [{**nvml["gpus"][0], "cc": None}]}).gpus
    assert (gpu.compute_cap, gpu.sm) == (None, None)
    assert GpuFacts("none").count == 0


# -- vigil's own agent on a real H200 (tests/fixtures/gpus/h200_vigil: idle, and busy/
# while a real CUDA process held 6 GiB) -------------------------------------------------


def test_the_agents_real_h200_reading_nvml_and_smi_agree() -> None:
    raw = recorded("agent_gpu_facts.json")
    g = from_agent(raw)
    assert (g.source, g.error, g.count, g.driver, g.cuda) == (
        "nvml", None, 1, "580.159.04", "13.0")  # cuda_driver 13000
    gpu = g.gpus[0]
    assert (gpu.index, gpu.name, gpu.uuid, gpu.sm, gpu.memory_total_bytes) == (
        0, "NVIDIA H200", H200_UUID, "sm_90", 143771 * MIB)
    # what NVML does not read comes from the CSV of the same reading, matched by UUID
    assert (gpu.bus_id, gpu.persistence, gpu.mig, gpu.ecc_uncorrected,
            gpu.retired_pages_pending, gpu.remap_pending, gpu.remap_failure) == (
        "00000000:00:06.0", True, False, 0, None, False, False)
    assert gpu.processes == () and stale_processes(g, [], raw["cmdlines"]) == []
    # nvidia-smi alone: the same GPU; its CSV has no CUDA field, the driver table agrees
    s = from_agent(smi_only(raw))
    (sg,) = s.gpus
    assert (s.source, s.driver, s.cuda, newest_cuda(s)) == (
        "nvidia-smi", "580.159.04", None, "13.0")
    assert replace(sg, memory_used_bytes=0) == replace(gpu, memory_used_bytes=0)
    # ...but not the same "used": NVML (nvmlDeviceGetMemoryInfo v1) counts the driver's
    # reservation, which the XML shows and nvidia-smi's memory.used leaves out
    assert (gpu.memory_used_bytes, sg.memory_used_bytes) == (644939776, 0)
    assert "<reserved>616 MiB</reserved>" in text("h200_vigil/smi.xml")
    assert abs(gpu.memory_used_bytes - sg.memory_used_bytes - 616 * MIB) < 2 * MIB
    assert health_problems("h200", g, GpuPolicy(), need=1) == []
    assert health_lines(g, GpuPolicy()) == [
        "GPU 0: sm_90; persistence on; MIG off; ECC uncorrected 0; pending: none",
        "Xid events in the last 24 h (dmesg): 0"]


def test_the_real_xml_report_agrees_with_the_csv() -> None:
    xml = parse_smi_xml(text("h200_vigil/smi.xml"))
    csv = parse_smi(text("h200_vigil/query_gpu.csv"), text("h200_vigil/compute_apps.csv"),
                    text("h200_vigil/list.txt"))
    assert (xml.driver, xml.cuda, csv.driver) == ("580.159.04", "13.0", "580.159.04")
    (x,), (c,) = xml.gpus, csv.gpus
    # the XML has no compute capability, the CSV query no repair fields and no lifetime
    # ECC count (vigil asks for none); everything else they both carry agrees
    assert (x.compute_cap, c.compute_cap) == (None, "9.0")
    assert (c.channel_repair_pending, c.tpc_repair_pending, c.unrepairable_memory) == (
        None, None, None)
    assert (x.ecc_uncorrected_aggregate, c.ecc_uncorrected_aggregate) == (0, None)
    assert replace(x, compute_cap="9.0", channel_repair_pending=None, tpc_repair_pending=None,
                   unrepairable_memory=None, ecc_uncorrected_aggregate=None) == c
    assert (c.name, c.uuid, c.memory_total_bytes, c.memory_used_bytes, c.ecc_uncorrected,
            c.processes, c.mig_devices) == ("NVIDIA H200", H200_UUID, 143771 * MIB, 0, 0, (), ())


def test_real_dmesg_iso_lines_with_a_comma_parse_and_hold_no_xid() -> None:
    raw = recorded("agent_gpu_facts.json")
    assert raw["kernel"].splitlines() == text("h200_vigil/kernel.txt").splitlines()
    g = from_agent(raw)
    assert (g.xids, g.kernel_log, g.now) == ((), "dmesg", datetime(2026, 11, 30, 18, 45, 23,
                                                                  tzinfo=UTC))
    # the real prefix (`dmesg --time-format iso`: a comma before the fraction) in front of
    # the real Xid 109 line of the ctime capture: timed, matched to the H200 by PCI address
    prefix = raw["kernel"].splitlines()[-1].split(" NVRM: ", 1)[0]
    assert prefix == "2026-11-30T18:44:56,478566+00:00"
    xid = text("kernel/dmesg_ctime_xid13_xid109.txt").splitlines()[-1].split("] ", 1)[1]
    h200 = g.gpus[0]
    (ev,) = parse_xids(f"{prefix} {xid}", [replace(h200, bus_id="00000000:CB:00.0")])
    assert (ev.code, ev.time, ev.gpu) == (109, datetime(2026, 11, 30, 18, 44, 56, tzinfo=UTC), 0)
    strict = GpuPolicy(refuse_xids=frozenset({109}))
    (err,) = health_problems("h200", replace(g, xids=(ev,)), strict, need=1)
    assert "1 Xid event(s) in the last 24 h (dmesg)" in str(err)
    # that host ran in UTC, which is also what a zone-less line is taken as; dmesg prints
    # the local zone, so the same prefix one zone east pins the comma's handling
    (east,) = parse_xids(f"{prefix.replace('+00:00', '+01:00')} {xid}")
    assert east.time == datetime(2026, 11, 30, 17, 44, 56, tzinfo=UTC)


def test_a_real_cuda_process_on_the_h200_is_a_holder_that_is_not_vigils() -> None:
    raw = recorded("busy/agent_gpu_facts.json")
    g = from_agent(raw)
    (proc,) = g.gpus[0].processes
    assert (proc.pid, proc.used_bytes, proc.name) == (476, 6826 * MIB, None)  # NVML: no name
    (sproc,) = from_agent(smi_only(raw)).gpus[0].processes
    assert (sproc.pid, sproc.used_bytes, sproc.name) == (476, 6826 * MIB,
                                                         "/opt/torch/.venv/bin/python3")
    # busy, the same ~615 MiB apart: NVML 7449.9 MiB, nvidia-smi 6835 MiB
    assert g.gpus[0].memory_used_bytes == 7811760128
    assert from_agent(smi_only(raw)).gpus[0].memory_used_bytes == 6835 * MIB
    (stale,) = stale_processes(g, [4242], raw["cmdlines"])
    assert stale.describe().startswith(
        "pid 476 holds 6.7 GiB on GPU 0: /opt/torch/.venv/bin/python3 -c import sys, torch\n"
        "hold = torch.empty(6 << 30")
    assert stale_processes(g, [476], raw["cmdlines"]) == []  # the service's own: not stale
    t = target()
    facts = facts_for(t, gpus=raw)  # no service pids: everything on the GPU is another's
    (held,) = [str(e) for e in problems("llm-one", t.profile, t.rendered, facts, stack=t.stack)
               if "held by" in str(e)]
    assert "GPU memory is held by 1 process(es) outside vllm.service" in held
    assert "pid 476 holds 6.7 GiB on GPU 0: /opt/torch/.venv/bin/python3" in held
    # --kill-stale ends exactly that process, re-checked by its real start time and command
    (kill,) = [a for a in make_plan("llm-one", t.stack, t.rendered, facts,
                                    kill_pids=(476,)).actions if a.kind == "kill"]
    assert kill.payload["expect"] == {"476": {"start": 3118, "cmdline": raw["cmdlines"]["476"]}}


def test_both_real_probe_readings_reproduced_and_read_by_the_watcher(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = recorded("busy/probe_gpus.json")
    facts = recorded("busy/agent_gpu_facts.json")
    # NVML: the agent's own read of that moment, through the probe's in-process path
    monkeypatch.setitem(agent._NVML, "nvml_read", lambda: facts["nvml"])
    assert agent.probe_gpus(False) == probe["nvml"]
    # nvidia-smi: the real CSVs of that moment replayed
    fake_smi(tmp_path, monkeypatch, "h200_vigil/busy")
    assert agent.probe_gpus(True) == probe["smi"]
    for source, used in (("nvml", 7449.875), ("smi", 6835.0)):
        gpus = Snapshot.from_dict({"time": 0.0, "gpus": probe[source]}).gpus
        assert gpus is not None and gpus.error is None
        (dev,) = gpus.devices
        assert (dev.name, dev.memory_total_mib, gpus.used_mib) == (
            "NVIDIA H200", 143771.0, used)
        assert [(p.pid, p.used_mib) for p in dev.processes] == [(476, 6826.0)]
    assert recorded("probe_gpus.json")["devices"][0]["memory_used_mib"] == 615.0625  # idle


def test_the_real_cu130_torch_on_the_h200() -> None:
    reply = {"torch_cuda": recorded("busy/torch_cuda.json")}
    assert reply["torch_cuda"]["archs"] == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                            "sm_120"]
    gpus = list(from_agent(recorded("busy/agent_gpu_facts.json")).gpus)
    cu130 = Stack(name="cu130", packages={"vllm": "0.20.0", "torch": "2.11.0"}, cuda="13.0",
                  gpu_archs={"torch": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                       "sm_120"]})
    assert installed_arch_problems(cu130, reply) == []  # sm_90 kernels for the 9.0 GPU
    assert arch_problems("h200", cu130, gpus) == []
    # the repo's CUDA 12.9 stacks state sm_70; CUDA 13's torch dropped Volta
    (lacks,) = installed_arch_problems(target().stack, reply)
    assert lacks.startswith("torch 2.10.0 lacks sm_70, which stack vllm-0.16-nightly states")
    # a stack built for Blackwell only has no kernels for this Hopper GPU
    blackwell = cu130.model_copy(update={"gpu_archs": {"torch": ["sm_100"]}})
    (err,) = arch_problems("h200", blackwell, gpus)
    assert str(err.message).startswith(
        "h200: GPU 0 is sm_90 (NVIDIA H200); torch 2.11.0, CUDA 13.0 has kernels up to sm_100")
    # the real driver: CUDA 13.0 fits (580.65.06), 13.1 does not (590.44.01)
    real = from_agent(recorded("busy/agent_gpu_facts.json"))
    assert driver_problems("h200", cu130, real) == []
    (old,) = driver_problems("h200", cu130.model_copy(update={"cuda": "13.1"}), real)
    assert "driver 580.159.04 (its newest CUDA is 13.0) is older than 590.44.01" in str(old)


# -- NVML health: the agent's own reads on the real H200 (h200_vigil/nvml_health/) -------

HEALTH = VIGIL / "nvml_health"
H200_HEALTH = {  # what NVML really answered there (driver 580.159.04, nvidia-ml-py 13.610.43)
    "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0,
    "retired_pages_pending": {
        "not_supported": "nvmlDeviceGetRetiredPagesPendingStatus: Not Supported"},
    "remapped_rows": [0, 0, 0, 0], "repair_status": [0, 0], "unrepairable_memory": 0}
HEALTH_FIELDS = ("ecc_uncorrected", "ecc_uncorrected_aggregate", "retired_pages_pending",
                 "remap_pending", "remap_failure", "channel_repair_pending",
                 "tpc_repair_pending", "unrepairable_memory")


def health_of(g: Any) -> tuple[Any, ...]:
    return tuple(getattr(g, f) for f in HEALTH_FIELDS)


def health_raw(name: str = "agent_gpu_facts.json") -> dict[str, Any]:
    return json.loads((HEALTH / name).read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["agent_gpu_facts.json", "busy/agent_gpu_facts.json"])
def test_the_real_h200_nvml_health_reads_parse_to_what_the_h200_said(name: str) -> None:
    raw = health_raw(name)
    assert raw["nvml"]["gpus"][0]["health"] == H200_HEALTH  # idle, and under a 6 GiB load
    (nvml,) = parse_nvml(raw["nvml"]).gpus
    # Hopper remaps rows instead of retiring pages: NVML says "Not Supported", and that
    # stays unknown (None), not "no pages pending"
    assert health_of(nvml) == (0, 0, None, False, False, False, False, False)
    g = from_agent(raw)
    assert g.source == "nvml" and health_of(g.gpus[0]) == health_of(nvml)
    assert health_problems("h200", g, GpuPolicy(), need=1) == []
    assert health_lines(g, GpuPolicy())[0] == (
        "GPU 0: sm_90; persistence on; MIG off; ECC uncorrected 0; pending: none")
    # the same moment's XML says the same (its retired pages "N/A" too) ...
    (xml,) = parse_smi_xml((HEALTH / "smi.xml").read_text()).gpus
    assert health_of(xml) == health_of(nvml)
    # ... and without NVML the agent's CSV leaves the repair fields unknown: NVML is what
    # makes them known on a host that never needs the XML fallback
    (csv,) = from_agent(smi_only(raw)).gpus
    assert (csv.channel_repair_pending, csv.tpc_repair_pending, csv.unrepairable_memory,
            csv.ecc_uncorrected_aggregate, csv.retired_pages_pending) == (
        None, None, None, None, None)
    assert (csv.ecc_uncorrected, csv.remap_pending, csv.remap_failure) == (0, False, False)


class ComposedNvmlError(Exception):
    """Composed: pynvml's NVMLError carries the return code as ``.value``."""

    def __init__(self, value: int) -> None:
        super().__init__({3: "Not Supported", 13: "Function Not Found"}.get(value, "Unknown"))
        self.value = value


def composed_pynvml(answers: dict[str, Any]) -> Any:
    """Composed stand-in for nvidia-ml-py (no GPU here), answering with the H200's recorded
    values; an answer that is an exception is raised. Calls it lacks are absent."""
    import types

    n = types.ModuleType("pynvml")
    reading = health_raw()["nvml"]
    gpu = reading["gpus"][0]

    def answer(name: str, value: Any) -> Any:
        def call(*_: Any) -> Any:
            if isinstance(value, Exception):
                raise value
            return value
        return call

    basics = {"nvmlInit": None, "nvmlShutdown": None, "nvmlDeviceGetCount": 1,
              "nvmlSystemGetDriverVersion": reading["driver"], "nvmlDeviceGetHandleByIndex": 0,
              "nvmlDeviceGetMemoryInfo": types.SimpleNamespace(total=gpu["memory_total"],
                                                               used=gpu["memory_used"]),
              "nvmlDeviceGetComputeRunningProcesses": [],
              "nvmlDeviceGetCudaComputeCapability": tuple(gpu["cc"]),
              "nvmlDeviceGetName": gpu["name"].encode(), "nvmlDeviceGetUUID": gpu["uuid"],
              "nvmlSystemGetCudaDriverVersion": reading["cuda_driver"]}
    for name, value in {**basics, **answers}.items():
        setattr(n, name, answer(name, value))
    n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC = 1, 0, 1
    return n


def test_the_agent_reads_each_nvml_health_value_on_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    h200 = {"nvmlDeviceGetTotalEccErrors": 0,
            "nvmlDeviceGetRetiredPagesPendingStatus": ComposedNvmlError(3),
            "nvmlDeviceGetRemappedRows": (0, 0, 0, 0), "nvmlDeviceGetRepairStatus": [0, 0],
            "nvmlDeviceGetUnrepairableMemoryFlag_v1": 0}
    monkeypatch.setitem(sys.modules, "pynvml", composed_pynvml(h200))
    read = agent._NVML["nvml_read"]
    assert read(True) == health_raw()["nvml"]  # the H200's whole reading, reproduced
    assert "health" not in read()["gpus"][0]  # the probe's per-poll read asks for none
    # an older nvidia-ml-py without the repair calls, a driver without the function, and
    # a read that fails: each its own answer, the other reads still made
    older = {**h200, "nvmlDeviceGetRemappedRows": ComposedNvmlError(13),
             "nvmlDeviceGetTotalEccErrors": ComposedNvmlError(999)}
    n = composed_pynvml(older)
    del n.nvmlDeviceGetRepairStatus, n.nvmlDeviceGetUnrepairableMemoryFlag_v1
    monkeypatch.setitem(sys.modules, "pynvml", n)
    assert read(True)["gpus"][0]["health"] == {
        "ecc_uncorrected_volatile": {"error": "nvmlDeviceGetTotalEccErrors: Unknown"},
        "ecc_uncorrected_aggregate": {"error": "nvmlDeviceGetTotalEccErrors: Unknown"},
        "retired_pages_pending": H200_HEALTH["retired_pages_pending"],
        "remapped_rows": {"not_supported": "nvmlDeviceGetRemappedRows: Function Not Found"},
        "repair_status": {"not_supported": "nvidia-ml-py has no nvmlDeviceGetRepairStatus"},
        "unrepairable_memory": {
            "not_supported": "nvidia-ml-py has no nvmlDeviceGetUnrepairableMemoryFlag_v1"}}


def test_nvml_health_not_read_stays_unknown_and_nvidia_smi_fills_it() -> None:
    raw = health_raw()
    # composed: every NVML health read unsupported or failed, as an older GPU answers
    unread = {k: {"not_supported": f"{k}: Not Supported"} for k in H200_HEALTH}
    unread["remapped_rows"] = {"error": "nvmlDeviceGetRemappedRows: Unknown Error"}
    raw["nvml"]["gpus"][0]["health"] = unread
    (alone,) = parse_nvml(raw["nvml"]).gpus
    assert health_of(alone) == (None,) * len(HEALTH_FIELDS)  # unknown, never healthy
    assert "ECC uncorrected ?" in health_lines(GpuFacts("nvml", (alone,)), GpuPolicy())[0]
    # the real CSV of the same moment fills what it carries; the repairs stay unknown
    (g,) = from_agent(raw).gpus
    assert health_of(g) == (0, None, None, False, False, None, None, None)
    # ... and its XML fallback fills them too
    (x,) = from_agent({**raw, "smi_xml": (HEALTH / "smi.xml").read_text()}).gpus
    assert health_of(x) == (0, 0, None, False, False, False, False, False)


# (NVML health value, the XML element with its real text and the flipped one, what
# preflight says)
FLIPS = [
    ({"ecc_uncorrected_volatile": 2}, ("dram_uncorrectable", "0", "2"),
     "uncorrectable ECC errors since the driver loaded: GPU 0: 2"),
    ({"retired_pages_pending": 1}, ("pending_retirement", "N/A", "Yes"),
     "h200: GPU 0: retired pages pending"),
    ({"remapped_rows": [0, 1, 1, 0]}, ("remapped_row_pending", "No", "Yes"),
     "h200: GPU 0: row remap pending"),
    ({"remapped_rows": [0, 0, 0, 1]}, ("remapped_row_failure", "No", "Yes"),
     "h200: GPU 0: row remap failed"),
    ({"repair_status": [1, 0]}, ("channel_repair_pending", "No", "Yes"),
     "h200: GPU 0: channel repair pending"),
    ({"repair_status": [0, 1]}, ("tpc_repair_pending", "No", "Yes"),
     "h200: GPU 0: TPC repair pending"),
    ({"unrepairable_memory": 1}, ("unrepairable_memory", "No", "Yes"),
     "h200: GPU 0: unrepairable memory"),
]


@pytest.mark.parametrize(("nvml", "xml", "said"), FLIPS)
def test_preflight_refuses_the_same_fact_alike_from_nvml_or_nvidia_smi(
        nvml: dict[str, Any], xml: tuple[str, str, str], said: str) -> None:
    # composed: no real GPU with these set was found; one value of the real H200 reading
    # (NVML health, or its smi.xml of the same moment) is flipped to what the driver says
    raw = health_raw()
    real_xml = (HEALTH / "smi.xml").read_text()
    tag, was, now = xml
    assert f"<{tag}>{was}</{tag}>" in real_xml  # the first: <volatile> before <aggregate>
    raw["nvml"]["gpus"][0]["health"] = {**H200_HEALTH, **nvml}
    by_nvml = from_agent({"nvml": raw["nvml"]})
    by_xml = from_agent({"smi_xml": real_xml.replace(f"<{tag}>{was}</{tag}>",
                                                     f"<{tag}>{now}</{tag}>", 1)})
    (a,), (b,) = (health_problems("h200", g, GpuPolicy(), need=1) for g in (by_nvml, by_xml))
    assert (str(a), a.fix) == (str(b), b.fix)
    assert said in str(a)
    # NVML wins over the CSV of the same reading, which says all is well
    (c,) = health_problems("h200", from_agent(raw), GpuPolicy(), need=1)
    assert str(c) == str(a)
    # and the CSV fills the fact when NVML could not read it (the ECC count, remap flags)
    if "ecc_uncorrected_volatile" in nvml:
        raw["nvml"]["gpus"][0]["health"]["ecc_uncorrected_volatile"] = {"error": "x"}
        raw["smi_gpus"] = raw["smi_gpus"].replace("Disabled, 0, [N/A]", "Disabled, 2, [N/A]")
        (d,) = health_problems("h200", from_agent(raw), GpuPolicy(), need=1)
        assert str(d) == str(a)


def test_a_lifetime_ecc_count_is_shown_not_refused() -> None:
    raw = health_raw()
    # composed: a GPU with 3 uncorrectable errors in its life, none since the driver loaded
    raw["nvml"]["gpus"][0]["health"]["ecc_uncorrected_aggregate"] = 3
    g = from_agent(raw)
    assert health_problems("h200", g, GpuPolicy(), need=1) == []
    assert health_lines(g, GpuPolicy())[0] == (
        "GPU 0: sm_90; persistence on; MIG off; ECC uncorrected 0 (3 in the GPU's lifetime); "
        "pending: none")


def test_malformed_nvml_health_is_one_clear_error() -> None:
    raw = health_raw()
    for bad, said in (([0, 0], "gpu 0 NVML health remapped_rows: expected 4 number"),
                      ("yes", "gpu 0 NVML health remapped_rows: expected 4 number")):
        raw["nvml"]["gpus"][0]["health"]["remapped_rows"] = bad
        with pytest.raises(GpuParseError, match=said):
            parse_nvml(raw["nvml"])
    raw["nvml"]["gpus"][0]["health"] = ["not", "a", "mapping"]
    with pytest.raises(GpuParseError, match="gpu 0 NVML health: expected a mapping"):
        parse_nvml(raw["nvml"])
