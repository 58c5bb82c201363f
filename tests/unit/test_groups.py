"""Node groups (issue 10): the inventory's checks, the rendered units (golden), the
group deploy plan and the group verdict — all pure, no host.

Golden files: tests/fixtures/golden-groups/rendered/<group>/<host>/. After a deliberate
change regenerate and review the diff:

    VIGIL_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/test_groups.py -k golden
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.paths import FIXTURES, REPO, TRACES
from vigil.deploy.group import order, plan_group, releases, rollback_steps, target_of
from vigil.desired import group_spec, inventory
from vigil.desired.engines.ray import RAY_NODES, ray_alive_nodes
from vigil.desired.groups import CPU_LAUNCHER, NodeGroup, resolve_group
from vigil.desired.targets import Target
from vigil.errors import ConfigError, RefusedError
from vigil.tasks.group import _group_log
from vigil.verify import replay
from vigil.verify.budgets import BudgetKey, Budgets
from vigil.verify.group import (
    GroupState,
    NodeView,
    RayJoin,
    every,
    group_key,
    group_state,
    watch_group,
)
from vigil.verify.reducer import Fatal, PhaseSpan, WatchState, initial, step
from vigil.verify.snapshot import Smoke, Snapshot, Unit

GOLDEN = FIXTURES / "golden-groups"
ENV = {"HF_TOKEN": "hf_secret_value"}


def _inv(tmp_path: Path, group_yml: str | None = None, hosts_yml: str | None = None,
         name: str = "g", keep_golden_groups: bool = False) -> inventory.Inventory:
    inv = tmp_path / "inventory"
    shutil.copytree(GOLDEN / "inventory", inv)
    if not keep_golden_groups:
        for f in (inv / "node_groups").glob("*.yml"):
            f.unlink()
    for part in ("models", "stacks"):
        for f in (REPO / "inventory" / part).glob("*.yml"):
            shutil.copy(f, inv / part / f.name)
    if hosts_yml is not None:
        (inv / "hosts.yml").write_text(hosts_yml)
    if group_yml is not None:
        (inv / "node_groups" / f"{name}.yml").write_text(group_yml)
    return inventory.load(inv)


def _resolve(tmp_path: Path, group_yml: str, hosts_yml: str | None = None,
             sets: tuple[str, ...] = ()) -> NodeGroup:
    return resolve_group(_inv(tmp_path, group_yml, hosts_yml), "g", operator_env=ENV,
                         sets=sets)


# -- rendering ----------------------------------------------------------------------


def _exec_start(unit: str) -> list[str]:
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_native_units_carry_rank_master_and_headless_per_node() -> None:
    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-native", operator_env=ENV)
    head, worker = (_exec_start(n.target.rendered.unit_text) for n in g.nodes)
    # vllm serve through the CLI: --headless is honoured only there (run_headless)
    assert head[:2] == ["/opt/vigil/envs/current/bin/vllm", "serve"]
    for argv, rank in ((head, 0), (worker, 1)):
        assert argv[-5 + (rank == 0):][:4] == ["--nnodes=2", f"--node-rank={rank}",
                                                "--master-addr=10.0.0.11",
                                                "--master-port=29501"]
        assert "--tensor-parallel-size=8" in argv and "--pipeline-parallel-size=2" in argv
    assert "--headless" not in head and worker[-1] == "--headless"
    assert g.layout.label == "2n-tp8-pp2-dp1-native" and g.layout.per_node == 8
    # the secret stays in the env file only
    assert "hf_secret_value" not in g.head.target.rendered.unit_text
    assert "hf_secret_value" in g.head.target.rendered.env_text


def test_ray_units_start_the_cluster_and_vllm_on_the_head_only() -> None:
    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-ray", operator_env=ENV)
    head, worker = g.nodes
    assert head.serves and not worker.serves
    assert _exec_start(head.target.rendered.unit_text)[-1] == \
        "--distributed-executor-backend=ray"
    assert head.side is not None and worker.side is not None
    assert list(head.side.argv) == [
        "/opt/vigil/envs/current/bin/ray", "start", "--block", "--disable-usage-stats",
        "--node-ip-address=10.0.0.13", "--head", "--port=6379", "--num-gpus=8"]
    assert "--address=10.0.0.13:6379" in worker.side.argv and "--head" not in worker.side.argv
    assert "Before=vllm.service" in head.side.text and "Before=" not in worker.side.text


def test_cpu_nodes_run_the_cli_through_the_launcher(tmp_path: Path) -> None:
    hosts = ("hosts:\n  a: {address: 127.0.0.1, port: 8191}\n"
             "  b: {address: 127.0.0.1, port: 8192}\n")
    g = _resolve(tmp_path, "head: a\nworkers: [b]\nmodel: tiny-cpu\n", hosts,
                 sets=("pipeline_parallel_size=2",))
    argv = _exec_start(g.nodes[1].target.rendered.unit_text)
    assert argv[:4] == ["/opt/vigil/envs/current/bin/python", "-c", CPU_LAUNCHER, "serve"]
    assert argv[-1] == "--headless" and "--master-addr=127.0.0.1" in argv


def _golden_files() -> dict[str, str]:
    inv = inventory.load(GOLDEN / "inventory")
    files = {}
    for name in group_spec.names(inv):
        g = resolve_group(inv, name, operator_env={}, require_secrets=False)
        for n in g.nodes:
            base = f"{name}/{n.name}"
            if n.serves:
                files[f"{base}/vllm.service"] = n.target.rendered.unit_text
                files[f"{base}/vllm.env"] = n.target.rendered.env_masked
            if n.side is not None:
                files[f"{base}/{n.side.name}"] = n.side.text
    return files


def test_golden_group_units() -> None:
    files = _golden_files()
    root = GOLDEN / "rendered"
    if os.environ.get("VIGIL_REGEN_GOLDEN"):
        shutil.rmtree(root, ignore_errors=True)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    on_disk = {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
               if p.is_file()}
    assert on_disk == files


def test_node_note_does_not_change_single_host_units(tmp_path: Path) -> None:
    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-native", operator_env=ENV)
    assert "# Node group glm-native: node 1 of 2, worker, headless" in \
        g.nodes[1].target.rendered.unit_text
    single = (REPO / "tests/fixtures/golden/rendered/glm-5/vllm.service").read_text()
    assert "Node group" not in single


# -- inventory checks -----------------------------------------------------------------


@pytest.mark.parametrize(("group_yml", "sets", "error", "words"), [
    ("head: gpu-a\nworkers: [gpu-x]\n", (), ConfigError, ["workers", "'gpu-x'", "hosts.yml"]),
    ("head: gpu-a\nworkers: [gpu-a]\n", (), ConfigError, ["twice", "head is not a worker"]),
    ("head: gpu-a\nworkers: [gpu-b]\nbackend: mpi\n", (), ConfigError, ["backend"]),
    ("head: gpu-a\nworkers: []\n", (), ConfigError, ["workers"]),
    ("head: gpu-a\nworkers: [gpu-b, gpu-c]\nmodel: glm-5-pp2\n", (), ConfigError,
     ["16 ranks do not split evenly over 3 nodes", "--nnodes"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\n", ("tensor_parallel_size=16",),
     RefusedError, ["gpu-a", "16 GPUs of work on each of its 2 nodes", "has 8"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\n", ("num_hidden_layers=1",),
     ConfigError, ["pipeline_parallel_size 2", "1 layers"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\nmaster_addr: 127.0.0.1\n", (),
     ConfigError, ["master_addr", "loopback"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\nmaster_port: 8000\n", (),
     ConfigError, ["master_port", "HTTP port"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\nbackend: ray\nstack: vllm-0.16-nightly\n",
     (), ConfigError, ["backend", "pin ray", "vllm-0.16-nightly"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: tiny-cpu\nbackend: ray\n",
     ("pipeline_parallel_size=2",), RefusedError,
     ["current platform cpu does not support ray.", "set prove_cpu_ray_refusal: true"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\nprove_cpu_ray_refusal: true\n", (),
     ConfigError, ["g.yml: prove_cpu_ray_refusal: only a CPU group", "cuda with backend native"]),
    ("head: gpu-a\nworkers: [gpu-b]\nmodel: tiny-cpu\nprove_cpu_ray_refusal: true\n",
     ("pipeline_parallel_size=2",), ConfigError, ["cpu with backend native"]),
])
def test_bad_groups_are_one_clear_error(tmp_path: Path, group_yml: str,
                                        sets: tuple[str, ...], error: type[Exception],
                                        words: list[str]) -> None:
    with pytest.raises(error) as exc:
        _resolve(tmp_path, group_yml, sets=sets)
    assert type(exc.value) is error
    for word in words:
        assert word in str(exc.value), str(exc.value)


def test_the_lab_deploys_a_cpu_ray_group_only_when_told_and_is_told_it_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = _resolve(tmp_path, "head: gpu-a\nworkers: [gpu-b]\nmodel: tiny-cpu\nbackend: ray\n"
                 "prove_cpu_ray_refusal: true\n", sets=("pipeline_parallel_size=2",))
    assert len(g.notes) == 1
    assert "vLLM will refuse this group at engine start (ValueError: current platform cpu " \
        "does not support ray.)" in g.notes[0]
    assert "crashed (executor_unsupported)" in g.notes[0]
    head, worker = g.nodes
    argv = _exec_start(head.target.rendered.unit_text)
    assert argv[1:3] == ["-c", CPU_LAUNCHER] and argv[-1] == "--distributed-executor-backend=ray"
    assert head.side is not None and worker.side is not None and not worker.serves
    # every group task's log says the note first, before any host is touched
    _group_log(g)("-", "first host line")
    said = capsys.readouterr().out.splitlines()
    assert "vLLM will refuse this group at engine start" in said[0], said
    assert said[-1].endswith("first host line"), said
    # a group without the switch says nothing extra
    assert resolve_group(inventory.load(GOLDEN / "inventory"), "glm-ray",
                         operator_env=ENV).notes == ()


def test_every_node_needs_the_same_stack(tmp_path: Path) -> None:
    hosts = (GOLDEN / "inventory" / "hosts.yml").read_text().replace(
        "gpu-b: {address: 10.0.0.12}", "gpu-b: {address: 10.0.0.12, stack: vllm-0.16-nightly}")
    with pytest.raises(ConfigError) as exc:
        _resolve(tmp_path, "head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\n", hosts)
    assert "node gpu-b runs stack vllm-0.16-nightly, the head gpu-a runs vllm-0.16-ray" \
        in str(exc.value)
    assert "fix: set stack: vllm-0.16-ray in the group file" in str(exc.value)


def test_every_node_needs_the_same_flags(tmp_path: Path) -> None:
    hosts = (GOLDEN / "inventory" / "hosts.yml").read_text().replace(
        "gpu-b: {address: 10.0.0.12}",
        "gpu-b: {address: 10.0.0.12, overrides: {max_model_len: 8192}}")
    with pytest.raises(ConfigError) as exc:
        _resolve(tmp_path, "head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\n", hosts)
    assert "node gpu-b renders profile glm-5-pp2 differently" in str(exc.value)


def test_a_host_serves_one_group(tmp_path: Path) -> None:
    inv = _inv(tmp_path, "head: gpu-b\nworkers: [gpu-d]\nmodel: glm-5-pp2\n"
               "stack: vllm-0.16-ray\n", keep_golden_groups=True)
    with pytest.raises(ConfigError) as exc:
        resolve_group(inv, "g", operator_env=ENV)
    assert "also in node group 'glm-native'" in str(exc.value)
    assert group_spec.group_of(inv, "gpu-a") == "glm-native"
    assert group_spec.group_of(inv, "nobody") is None


def test_unknown_group_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_group(inventory.load(GOLDEN / "inventory"), "../hosts", operator_env=ENV)
    assert "glm-native, glm-ray" in str(exc.value)


# -- the group plan -----------------------------------------------------------------


def test_a_change_on_one_node_restarts_the_group_head_first() -> None:
    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-native", operator_env=ENV)
    plan = plan_group(g, {"gpu-a": False, "gpu-b": True})
    assert [(s.node, s.restart) for s in plan.steps] == [("gpu-a", True), ("gpu-b", True)]
    assert "the group restarts together (gpu-b changed)" in plan.steps[0].reason
    quiet = plan_group(g, {"gpu-a": False, "gpu-b": False})
    assert not quiet.restart and all(not s.restart for s in quiet.steps)
    assert plan_group(g, {"gpu-a": False, "gpu-b": False}, force_restart=True).restart
    with pytest.raises(ValueError):
        plan_group(g, {"gpu-a": True})
    assert order(g) == ("gpu-a", "gpu-b")


def test_rollback_puts_every_changed_node_back_head_first() -> None:
    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-native", operator_env=ENV)
    steps = rollback_steps(g, {"gpu-a": True, "gpu-b": True})
    assert [s.node for s in steps] == ["gpu-a", "gpu-b"]
    assert [s.node for s in rollback_steps(g, {"gpu-a": True, "gpu-b": False})] == ["gpu-a"]


@pytest.mark.parametrize("restart", [False, True])
def test_rollback_leaves_a_node_only_restarted_with_the_group(
        restart: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure rolls back only the releases this deploy replaced (their deploy kept the
    running release first): gpu-a, restarted with the group (or by --restart) but not
    replaced, keeps its files; a swap there would bring back an older release than the
    one that ran. The per-host deploy is a stand-in giving each release's result."""
    from vigil.deploy import group as group_mod
    from vigil.deploy.apply import Options
    from vigil.report import HostResult, Log

    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-native", operator_env=ENV)

    def deploy_host(t: Target, opts: Options, log: Log) -> HostResult:
        name = t.name
        if opts.check:  # --restart: the check of an unchanged node says changed too
            return HostResult(name, "changed" if name == "gpu-b" or restart else "ok")
        if name == "gpu-a":
            return HostResult(name, "changed", restarted=True, replaced=False)
        return HostResult(name, "failed", error="restart failed", replaced=True)

    monkeypatch.setattr(group_mod, "deploy_host", deploy_host)
    monkeypatch.setattr(group_mod, "check_reach", lambda g: None)  # no hosts here
    back: list[str] = []
    result = group_mod.deploy_group(g, Options(restart=restart, wait=False), Log(io.StringIO()),
                                    rollback=lambda step: back.append(step.key))
    assert result.status == "failed" and result.failed_node == "gpu-b"
    assert result.replaced == {"gpu-a": False, "gpu-b": True}
    assert back == ["gpu-b"] and result.rolled_back == ("gpu-b",)


# -- the group verdict ----------------------------------------------------------------


def _st(phase: str, verdict: str | None = None, now: float = 100.0,
        fatal_at: float | None = None, proof: str | None = None,
        cause: str | None = None) -> WatchState:
    fatal = (Fatal(cause or "engine_killed", proof or "x", "r", "root", fatal_at),) \
        if fatal_at is not None else ()
    return WatchState(started_at=0.0, now=now, spans=(PhaseSpan(phase, 0.0),),
                      verdict=verdict, fatal=fatal, proof=proof, cause=cause)


def test_the_group_phase_is_its_least_advanced_node_and_names_who_joined() -> None:
    gs = group_state([NodeView("a", 0, _st("loading_weights")),
                      NodeView("b", 1, _st("distributed_init"))])
    assert gs.verdict is None and gs.phase == "distributed_init"
    assert gs.joined == ("a",) and gs.missing == ("b",)
    assert gs.summary == "distributed_init: joined a; missing b"
    assert gs.phases == {"a": "loading_weights", "b": "distributed_init"}


def test_a_crash_on_any_node_is_the_groups_crash_naming_the_first() -> None:
    gs = group_state([
        NodeView("a", 0, _st("loading_weights", "crashed", now=200, fatal_at=150,
                             proof="EngineCore died", cause="engine_dead")),
        NodeView("b", 1, _st("loading_weights", "crashed", now=120, fatal_at=110,
                             proof="status=9/KILL", cause="engine_killed"))])
    assert (gs.verdict, gs.node, gs.cause) == ("crashed", "b", "engine_killed")
    assert gs.proof == "b: status=9/KILL" and gs.phase == "loading_weights"


PEER = ("(Worker_PP0 pid=2101) ERROR 11-30 16:02:47 [multiproc_executor.py:953] RuntimeError: "
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:9868.")


def _worker(fatal_at: float | None, now: float = 101.0) -> WatchState:
    fatal = () if fatal_at is None else (
        Fatal("unknown", "Exception: WorkerProc initialization failed", "r", "chain",
              fatal_at),)
    return WatchState(started_at=0.0, now=now, spans=(PhaseSpan("loading_weights", 0.0),),
                      fatal=fatal)


def _head_lost_peer(now: float = 101.5) -> WatchState:
    return _st("loading_weights", "crashed", now=now, fatal_at=100.764, proof=PEER,
               cause="unknown")


def test_the_origin_is_named_not_the_node_that_lost_its_peer() -> None:
    # lab, PP=2 (2026-11-30 16:02:47): lab2's ranks SIGKILLed while loading; lab1's rank
    # logged "Connection closed by peer" at .764 and its reducer concluded; lab2's main
    # process waited for its ranks and logged its own failure at .858, not yet concluded
    gs = group_state([NodeView("lab1", 0, _head_lost_peer()),
                      NodeView("lab2", 1, _worker(100.858))])
    assert (gs.verdict, gs.node) == ("crashed", "lab2")
    assert gs.proof == "lab2: Exception: WorkerProc initialization failed"
    assert gs.summary.endswith("; then lab1")
    # before lab2's own lines arrive the group waits for them (a bounded grace) ...
    gs = group_state([NodeView("lab1", 0, _head_lost_peer()),
                      NodeView("lab2", 1, _worker(None))])
    assert gs.verdict is None and "lab1 lost a peer" in gs.summary
    # ... and past it names the node that did fail
    gs = group_state([NodeView("lab1", 0, _head_lost_peer(now=130.0)),
                      NodeView("lab2", 1, _worker(None, now=130.0))])
    assert (gs.verdict, gs.node) == ("crashed", "lab1")
    # a failure of its own on a node wins over an earlier one that only lost a peer, and
    # among failures of their own the earliest wins
    gs = group_state([
        NodeView("a", 0, _st("loading_weights", "crashed", now=101.5, fatal_at=100.5,
                             proof="x", cause="unknown")),
        NodeView("b", 1, _worker(100.9))])
    assert gs.node == "a"


def test_a_node_that_never_joins_is_a_stall_in_distributed_init_naming_it() -> None:
    gs = group_state([NodeView("a", 0, _st("distributed_init", "stalled",
                                           proof="no progress 60 s")),
                      NodeView("b", 1, WatchState(), started=False)])
    assert (gs.verdict, gs.phase, gs.node) == ("stalled", "distributed_init", "b")
    assert gs.cause == "stalled_distributed_init"
    assert gs.proof is not None and "not joined: b (b: unit not running)" in gs.proof


def test_ready_needs_the_head_ready_and_every_worker_joined() -> None:
    ready = _st("ready", "ready", proof="completion: 4 tokens")
    gs = group_state([NodeView("a", 0, ready), NodeView("b", 1, _st("kv_cache"))])
    assert gs.verdict == "ready" and gs.joined == ("a", "b")
    # an idle joined worker's stall is no stall once the head serves
    idle = _st("api_starting", "stalled")
    assert group_state([NodeView("a", 0, ready), NodeView("b", 1, idle)]).verdict == "ready"
    # a worker that is still in distributed_init keeps the group undecided
    assert group_state([NodeView("a", 0, ready),
                        NodeView("b", 1, _st("distributed_init"))]).verdict is None


def test_a_stopped_node_stops_the_group() -> None:
    gs = group_state([NodeView("a", 0, _st("compiling")),
                      NodeView("b", 1, _st("compiling", "stopped", proof="Stopping"))])
    assert (gs.verdict, gs.node, gs.proof) == ("stopped", "b", "b: Stopping")


def test_history_key_includes_the_layout() -> None:
    key = BudgetKey(hardware="8xH200-141GB", gpu_kind="H200", model="glm-5-pp2",
                    config_hash="abc", stack="vllm=0.16", cache="cold")
    g = group_key(key, "2n-tp8-pp2-dp1-native")
    assert g.hardware == "2n-tp8-pp2-dp1-native x 8xH200-141GB" and g.model == key.model
    assert g != key


# -- preflight on a node: its share of the layout -----------------------------------


def test_preflight_judges_a_node_by_its_share_of_the_layout() -> None:
    from tests.doubles import capture, facts_for
    from vigil.deploy.preflight import problems

    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-native", operator_env=ENV)
    node = g.nodes[1].target
    assert node.gpus_needed == 8 and node.profile.gpus_needed == 16
    eight = capture("b200_x8")  # a real 8x B200 capture
    facts = facts_for(node, gpus=eight)

    def counted(gpus_needed: int | None, facts_: object = facts) -> list[str]:
        return [str(e) for e in problems(node.name, node.profile, node.rendered,
                                         facts_,  # type: ignore[arg-type]
                                         gpus_needed=gpus_needed)
                if "GPUs" in str(e) and "shows" in str(e)]

    assert counted(8) == []  # 8 of the 16 ranks live here
    assert any("= 16 GPUs; the host shows 8" in e for e in counted(None))
    head, *rows = str(eight["smi_gpus"]).splitlines()
    four = facts_for(node, gpus={**eight, "smi_gpus": "\n".join([head, *rows[:4]]) + "\n"})
    assert any("puts 8 GPUs of work on each node; the host shows 4" in e
               for e in counted(8, four))


# -- the front door -------------------------------------------------------------------


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INVOKE_VIGIL_INVENTORY": str(GOLDEN / "inventory"), "HF_TOKEN": "x"}
    return subprocess.run([str(REPO / ".venv" / "bin" / "invoke"), *args], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=120)


def test_group_render_writes_the_golden_files(tmp_path: Path) -> None:
    out = _invoke("group.render", "--name", "glm-ray", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "node group glm-ray: 2n-tp8-pp2-dp1-ray, head gpu-c" in out.stdout
    for rel in ("gpu-c/vllm.service", "gpu-c/vllm.env", "gpu-c/vllm-ray.service",
                "gpu-d/vllm-ray.service"):
        assert (tmp_path / "glm-ray" / rel).read_text() == \
            (GOLDEN / "rendered" / "glm-ray" / rel).read_text()
    assert not (tmp_path / "glm-ray" / "gpu-d" / "vllm.service").exists()


def test_a_bad_group_exits_2_before_any_host() -> None:
    out = _invoke("group.deploy", "--name", "glm-native", "--set",
                  "tensor_parallel_size=16")
    assert out.returncode == 2
    assert out.stderr.startswith("error: gpu-a: node group glm-native puts 16 GPUs")
    assert "Traceback" not in out.stderr


# -- the group watch over real recorded lab traces ------------------------------------


def _replaying(trace: str) -> tuple[Callable[[str | None], Snapshot], Callable[[], Smoke]]:
    """A node's probe replaying a real trace (its last snapshot repeats), and the smoke
    that trace recorded."""
    snaps = [Snapshot.from_json(line) for line in
             (TRACES / trace).read_text().splitlines()
             if line.strip()]
    it = iter(snaps)
    last: list[Snapshot] = []

    def probe(cursor: str | None) -> Snapshot:
        last.append(next(it, snaps[-1]))
        return last[-1]

    def smoke() -> Smoke:
        found = last[-1].smoke if last else None
        return found if found is not None else Smoke(ok=False, error="no smoke recorded")
    return probe, smoke


def test_watch_group_over_real_traces_crash_names_the_node() -> None:
    head_probe, head_smoke = _replaying("lab-cold-ready.jsonl")
    worker_probe, _ = _replaying("lab-kill9-crashed.jsonl")
    seen: list[GroupState] = []
    traces = {"a": io.StringIO(), "b": io.StringIO()}
    out = watch_group({"a": head_probe, "b": worker_probe}, {"a": 0, "b": 1}, head_smoke,
                      Budgets(), poll_s=0, sleep=lambda s: None, on_poll=seen.append,
                      traces=traces)
    final = out.history[-1]
    # each node's trace holds what its reducer folded: replayed, the same verdict
    b_state = initial()
    for line in traces["b"].getvalue().splitlines():
        b_state = step(b_state, Snapshot.from_json(line), Budgets())
    assert b_state.verdict == "crashed" and b_state.proof == out.nodes["b"].state.proof
    assert b_state.polls == out.nodes["b"].state.polls
    assert (final.verdict, final.node) == ("crashed", "b")
    assert final.proof is not None and final.proof.startswith("b: ")
    assert out.nodes["b"].state.verdict == "crashed"
    assert len(seen) == len(out.history) > 1


def test_watch_group_a_worker_not_started_is_never_joined() -> None:
    head_probe, head_smoke = _replaying("lab-cold-ready.jsonl")
    inactive = Snapshot(time=1.0, unit=Unit(name="vllm.service", active_state="inactive"))
    out = watch_group({"a": head_probe, "b": lambda cursor: inactive}, {"a": 0, "b": 1},
                      head_smoke, Budgets(), poll_s=0, sleep=lambda s: None,
                      deadline_s=-1)  # one round
    gs = out.history[-1]
    assert not out.nodes["b"].started and gs.phases["b"] == "not running"
    assert "b" in gs.missing and gs.summary.endswith("not running: b")


def test_a_node_is_never_deployed_or_verified_alone() -> None:
    from vigil.desired.targets import resolve

    with pytest.raises(ConfigError) as exc:
        resolve(inventory.load(GOLDEN / "inventory"), "gpu-b", operator_env=ENV)
    assert "host gpu-b is a node of node group glm-native" in str(exc.value)
    assert "invoke group.deploy --name glm-native" in str(exc.value)


def test_a_ray_group_starts_the_cluster_then_vllm_and_restarts_as_one() -> None:
    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-ray", operator_env=ENV)
    assert [(n, u) for n, u, _ in releases(g)] == [
        ("gpu-c", "ray"), ("gpu-d", "ray"), ("gpu-c", "vllm")]
    plan = plan_group(g, {"gpu-c/ray": False, "gpu-d/ray": True, "gpu-c": False})
    assert [(s.key, s.restart) for s in plan.steps] == [
        ("gpu-c/ray", True), ("gpu-d/ray", True), ("gpu-c", True)]
    assert "the group restarts together (gpu-d/ray changed)" in plan.steps[0].reason
    assert plan.describe()[1] == "apply gpu-d/ray (restart): changed"
    with pytest.raises(ValueError, match="no plan for gpu-c/ray"):
        plan_group(g, {"gpu-d/ray": True, "gpu-c": False})
    # rollback restores the cluster first, then vLLM on it (the start order)
    back = rollback_steps(g, {"gpu-c/ray": True, "gpu-d/ray": True, "gpu-c": True})
    assert [s.key for s in back] == ["gpu-c/ray", "gpu-d/ray", "gpu-c"]
    assert [s.key for s in rollback_steps(g, {"gpu-c": True})] == ["gpu-c"]


def test_a_ray_unit_is_a_release_of_its_own() -> None:
    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-ray", operator_env=ENV)
    head, worker = g.nodes
    assert head.side is not None and worker.side is not None
    t = worker.side.target
    step = rollback_steps(g, {"gpu-d/ray": True})[0]
    assert target_of(g, step) is t
    # its own unit, env file, backup and lock; the group's environment; no GPU checks or
    # watch of its own (the group's verify judges it)
    assert t.vars.service == "vllm-ray" and t.rendered.unit_text == worker.side.text
    assert t.rendered.paths.unit == "/etc/systemd/system/vllm-ray.service"
    assert t.rendered.paths.env == "/etc/vigil/vllm-ray.env"
    assert "EnvironmentFile=/etc/vigil/vllm-ray.env" in t.rendered.unit_text
    assert t.rendered.paths.backup_dir != head.target.rendered.paths.backup_dir
    assert t.rendered.paths.lock != head.target.rendered.paths.lock
    assert t.rendered.paths.env_dir == head.target.rendered.paths.env_dir
    assert not t.takes("preflight") and not t.takes("verify") and t.takes("service")
    assert target_of(g, plan_group(g, dict.fromkeys(
        ("gpu-c/ray", "gpu-d/ray", "gpu-c"), False)).steps[2]) is head.target


# -- real journals of a PP=2 group start on the lab (tests/lab/test_group_lab.py, 2026-11-30) --

LOGS = FIXTURES / "group-logs"


def _node_state(log: str, until: str | None = None) -> WatchState:
    """A node's reducer state over its real journal (up to a time, e.g. '13:10:00')."""
    lines = (LOGS / log).read_text().splitlines()
    if until is not None:
        lines = [x for x in lines if x[11:19] < until]
    return replay.run(replay.snapshots_from_log(lines), log_only=True)


def test_real_pp2_journals_make_a_ready_group_with_both_joined() -> None:
    head = _node_state("lab1-head-pp2-ready.log")
    worker = _node_state("lab2-worker-pp2-ready.log")
    assert head.verdict == "ready" and worker.verdict is None  # a worker has no HTTP
    assert worker.phase not in ("bootstrap", "engine_init", "distributed_init")
    gs = group_state([NodeView("lab1", 0, head), NodeView("lab2", 1, worker)])
    assert gs.verdict == "ready" and gs.joined == ("lab1", "lab2")


def test_real_pp2_journals_while_the_worker_installs() -> None:
    # 13:10:00: the head waits in distributed_init; lab2's unit has not started yet
    head = _node_state("lab1-head-pp2-ready.log", until="13:10:00")
    assert head.phase == "distributed_init" and head.verdict is None
    gs = group_state([NodeView("lab1", 0, head), NodeView("lab2", 1, initial(), False)])
    # the least advanced node has not started: the group is not past bootstrap yet
    assert gs.verdict is None and gs.phase == "bootstrap"
    assert gs.summary == ("distributed_init: joined none; missing lab1, lab2; "
                          "not running: lab2")
    # 13:11:00: lab2's ranks joined; the group waits on the least advanced node
    head = _node_state("lab1-head-pp2-ready.log", until="13:11:00")
    worker = _node_state("lab2-worker-pp2-ready.log", until="13:11:00")
    gs = group_state([NodeView("lab1", 0, head), NodeView("lab2", 1, worker)])
    assert gs.verdict is None and gs.joined == ("lab1", "lab2")


def test_real_journals_of_a_ranks_only_worker_kill_crash_the_group_naming_it() -> None:
    # tests/lab/test_group_lab.py's PP=2 group (2026-11-30): lab2's rank Worker_PP1 alone
    # SIGKILLed once joined; lab2's main process logs its executor's "[shutdown] … all
    # workers exited gracefully", then its traceback: a crash (a stop needs its trigger)
    head = _node_state("lab1-head-pp2-worker-ranks-killed.log")
    worker = _node_state("lab2-worker-pp2-ranks-killed.log")
    assert worker.verdict != "stopped" and head.verdict != "stopped"
    gs = group_state([NodeView("lab1", 0, head), NodeView("lab2", 1, worker)])
    assert gs.verdict == "crashed" and gs.node == "lab2", gs
    assert gs.proof == ("lab2: Exception: WorkerProc initialization failed due to an "
                        "exception in a background process. See stack trace for root cause.")


# -- a Ray group's cluster -----------------------------------------------------------

# real: verify's RAY_NODES (`ray.nodes()` as JSON) on lab7, the Ray head of a group that
# vigil deployed on lab7 and lab3 with Ray 2.60.0 (tests/lab/test_group_lab.py, 2026-11-30)
RAY_NODES_OUT = (LOGS / "ray-2.60.0-nodes-lab7-lab3.json").read_text()


def test_ray_nodes_counts_the_live_nodes() -> None:
    assert ray_alive_nodes(RAY_NODES_OUT) == 2
    nodes = json.loads(RAY_NODES_OUT)
    assert [n["NodeManagerHostname"] for n in nodes] == ["lab7", "lab3"]
    # a node Ray declared dead stays in the list with Alive false
    nodes[1]["Alive"] = False
    assert ray_alive_nodes("2026-11-30 ray.init noise\n" + json.dumps(nodes)) == 1
    # no node list: the head did not answer (RAY_NODES exits with its reason on stderr)
    assert ray_alive_nodes("") is None
    assert ray_alive_nodes("[not json") is None
    assert ray_alive_nodes('{"nodes": []}') is None


def test_ray_nodes_runs_as_a_script() -> None:
    # the snippet itself: a head that does not listen answers at once, with the reason
    res = subprocess.run([sys.executable, "-c", RAY_NODES, "127.0.0.1:1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith("ray head 127.0.0.1:1: "), res.stderr


def test_a_ray_group_is_ready_only_with_every_node_in_the_cluster() -> None:
    ready = replace(_st("ready"), verdict="ready", health_ok=True)
    head = [NodeView("gpu-c", 0, ready)]
    gs = group_state(head, RayJoin(1, 2))
    assert gs.verdict is None and gs.summary.endswith("ray: 1/2 nodes alive")
    assert group_state(head, RayJoin(None, 2, "no cluster")).summary.endswith(
        "ray: ?/2 nodes alive")
    assert group_state(head, RayJoin(2, 2)).verdict == "ready"


def test_a_ray_groups_crash_says_the_cluster_it_had() -> None:
    refused = _st("engine_init", "crashed", proof="ValueError: current platform cpu does "
                  "not support ray.", cause="executor_unsupported")
    gs = group_state([NodeView("lab7", 0, refused)], RayJoin(2, 2))
    assert gs.verdict == "crashed" and gs.node == "lab7" and gs.ray == RayJoin(2, 2)
    assert gs.summary == ("crashed on node lab7 (executor_unsupported) in engine_init; "
                          "ray: 2/2 nodes alive")
    assert group_state([NodeView("lab7", 0, refused)]).ray is None


def test_the_ray_check_runs_at_most_once_per_window() -> None:
    now = [0.0]
    answers = iter([RayJoin(1, 2), RayJoin(2, 2)])
    check = every(10.0, lambda: next(answers), clock=lambda: now[0])
    assert check() == RayJoin(1, 2)
    now[0] = 9.9
    assert check() == RayJoin(1, 2)  # the last answer, no second call
    now[0] = 10.0
    assert check() == RayJoin(2, 2)


def test_watch_group_of_ray_waits_for_the_cluster() -> None:
    head_probe, head_smoke = _replaying("lab-cold-ready.jsonl")
    alive = iter([1, 1, 2] + [2] * 10_000)
    out = watch_group({"a": head_probe}, {"a": 0}, head_smoke, Budgets(), poll_s=0,
                      sleep=lambda s: None, ray_check=lambda: RayJoin(next(alive), 2))
    final = out.history[-1]
    assert final.verdict == "ready"
    assert "ray: 1/2 nodes alive" in out.history[0].summary


def _local_release(tmp_path: Path) -> tuple[Target, Path]:
    """A target on this machine (the real agent over the local transport) whose env file
    holds A=1."""
    from tests.doubles import target_in

    t = target_in(tmp_path, "hosts:\n  h1: {connection: local, model: tiny-cpu, stack: "
                  f"lab-cpu, config_dir: {tmp_path}/etc, unit_dir: {tmp_path}/units, "
                  f"env_root: {tmp_path}/envs}}\n", "h1")
    env = Path(t.rendered.paths.env)
    env.parent.mkdir(parents=True)
    env.write_text("A=1\n")
    return t, env


def test_apply_plan_says_what_the_host_completed_before_a_failure(tmp_path: Path) -> None:
    """The real agent over the local transport: the backup and the env file were done
    before an action the agent refuses; ``done`` lists them (a group's rollback then
    knows the release was replaced: HostResult.replaced)."""
    from vigil.deploy.apply import apply_plan
    from vigil.deploy.plan import Action, Plan
    from vigil.errors import HostError
    from vigil.transport.local import LocalTransport

    t, env = _local_release(tmp_path)
    plan = Plan("h1", (Action("backup", "keep"), Action("write_env", "changed", {
        "content": "A=2\n", "mode": "600"}), Action("bogus", "refused")), True)
    done: list[str] = []
    with pytest.raises(HostError, match="unknown action bogus"):
        apply_plan(LocalTransport("h1"), t, plan, lambda _: None, done)
    assert done == ["backup", "write_env"]
    assert env.read_text() == "A=2\n"
    assert (Path(t.rendered.paths.backup_dir) / "env").read_text() == "A=1\n"


def test_the_drain_runs_after_the_install_and_right_before_the_restarting_round_trip(
        tmp_path: Path) -> None:
    """Issue 21.16: the drain ran before an install that can last minutes; a failed
    install left the host out of the pool with its old release serving. The real agent
    over the local transport: a failed install never drains; without an install the
    drain runs before any file of the release is written."""
    from vigil.deploy.apply import apply_plan
    from vigil.deploy.plan import Action, Plan
    from vigil.deploy.runtime import install_payload
    from vigil.errors import HostError
    from vigil.transport.local import LocalTransport

    t, env = _local_release(tmp_path)
    env_dir = f"{tmp_path}/envs/new"
    payload = {**install_payload(t.stack, env_dir, t.rendered.paths.current),
               "python": str(tmp_path / "no-such-python")}
    write = Action("write_env", "changed", {"content": "A=2\n", "mode": "600"})
    drained: list[str] = []

    def drain() -> None:
        drained.append(env.read_text())

    failing = Plan("h1", (Action("install_env", "pins", payload),
                          Action("mark_env", "mark", {"env_dir": env_dir}), write), True)
    with pytest.raises(HostError, match="failed verification; nothing was switched"):
        apply_plan(LocalTransport("h1"), t, failing, lambda _: None, [], before_stop=drain)
    assert drained == [] and env.read_text() == "A=1\n"
    apply_plan(LocalTransport("h1"), t, Plan("h1", (write,), True), lambda _: None, [],
               before_stop=drain)
    assert drained == ["A=1\n"] and env.read_text() == "A=2\n"
    # a plan that restarts nothing drains nothing
    apply_plan(LocalTransport("h1"), t, Plan("h1", (write,), False), lambda _: None, [],
               before_stop=drain)
    assert drained == ["A=1\n"]


def test_every_engine_module_is_found_and_an_unknown_backend_names_them() -> None:
    from vigil.desired import engines
    modules = {p.stem for p in Path(engines.__file__).parent.glob("*.py")}
    assert set(engines.registry()) == modules - {"__init__", "base"} == {"native", "ray"}
    with pytest.raises(ConfigError, match=r"backend 'mpi' is not an engine vigil knows") as err:
        engines.engine("mpi", "g.yml")
    assert err.value.fix == "use one of: native, ray"


@pytest.mark.parametrize(("given", "pause"), [(None, 7.0), (2.0, 2.0)])
def test_a_groups_watch_polls_by_the_one_rule_of_every_watch(
        monkeypatch: pytest.MonkeyPatch, given: float | None, pause: float) -> None:
    """--poll for every host, else the head's own poll_s, as a host's watch."""
    from contextlib import contextmanager

    from vigil.verify import group as group_mod
    from vigil.verify.watch import Settings

    g = resolve_group(inventory.load(GOLDEN / "inventory"), "glm-native", operator_env=ENV,
                      sets=("poll_s=7",))
    seen: dict[str, float] = {}

    @contextmanager
    def connect(name: str, hv: Any, *a: Any, **kw: Any) -> Iterator[Any]:
        yield type("T", (), {"name": name, "round_trips": 0})()

    def watch_group(*a: Any, poll_s: float, **kw: Any) -> Any:
        seen["poll_s"] = poll_s
        final = type("G", (), {"verdict": None})()
        return type("W", (), {"history": [final], "nodes": {
            n.name: type("N", (), {"state": None})() for n in g.nodes}})()

    monkeypatch.setattr(group_mod, "connect", connect)
    monkeypatch.setattr(group_mod, "watch_group", watch_group)
    group_mod.verify_group(g, Settings(poll_s=given))
    assert g.head.target.vars.poll_s == 7.0 and seen["poll_s"] == pause
