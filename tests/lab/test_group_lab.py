"""A node group on two real lab hosts: the tiny model split pipeline-parallel 2 across
lab6 (head, API server) and lab7 (headless worker) with vLLM's native multi-node on the
real vLLM CPU build, deployed and verified as one service.

Each real PP=2 start costs ~100 s+ on 2 cores, so this module has three starts: the
deploy that serves a completion through the head; the rollback's, after a release that
breaks the worker's start crashed the group within seconds (every node back on the
first release, verified ready); and one head start that proves both faults — first the
worker's unit never started (stalled in distributed_init naming lab7), then the worker
started late, joined, and killed while loading (crashed naming lab7). The
group uses its own unit (vllm-mn) and ports, so the single-host tests' vllm.service on
the same hosts is never touched.

The Ray backend runs on lab7 (head) and lab6 (worker), whose vLLM installs use uv: vigil
deploys the Ray units and vLLM on the head with ``group.deploy``, verify sees the cluster
whole through Ray's API, and vLLM's CPU build refuses Ray at engine start (the group file
says ``prove_cpu_ray_refusal: true``): crashed, executor_unsupported, naming the head.

Stops are bounded: the group's units get TimeoutStopSec=20 (host var timeout_stop_s) and
both nodes stop at once. On the lab's systemd-in-nspawn (cgroup v1) a stop otherwise
waits out the whole TimeoutStopSec (90 s) whenever a process outlives the unit's main
process (multiprocessing's resource tracker ignores SIGTERM and exits on EOF just after
it): systemd gets no empty-cgroup event there and ends "failed (Result: timeout)".
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lab import hosts as lab
from lab import wheels
from tests.doubles import linked_inventory
from tests.paths import REPO
from vigil.deploy.apply import Options
from vigil.deploy.group import deploy_group
from vigil.desired import inventory
from vigil.desired.engines.ray import RAY_NODES, ray_alive_nodes
from vigil.desired.groups import NodeGroup, resolve_group
from vigil.exitcodes import ExitCode
from vigil.report import Log
from vigil.verify.group import GroupState, verify_group
from vigil.verify.watch import Settings

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.drives(6, 7)]

HEAD, WORKER = 6, 7  # the lane of hosts 6 and 7 (tests/lanes.py), beside flashinfer's
UNIT = "vllm-mn"

HOSTS_YML = f"""
hosts:
  lab{HEAD}: {{address: 127.0.0.1, ssh_port: {lab.host_port(HEAD)}, port: 8191}}
  lab{WORKER}: {{address: 127.0.0.1, ssh_port: {lab.host_port(WORKER)}, port: 8192}}
groups:
  pair:
    hosts: [lab{HEAD}, lab{WORKER}]
    vars:
      ssh_user: root
      ssh_key: {lab.key_path()}
      known_hosts: {lab.known_hosts_path()}
      connect_timeout_s: 5
      service: {UNIT}
      model: tiny-cpu
      stack: lab-cpu
      restart_sec: 5
      timeout_stop_s: 20  # see the module's docstring
      overrides: {{pipeline_parallel_size: 2}}
"""
GROUP_YML = f"""
description: the tiny model, pipeline-parallel 2 over two lab hosts
head: lab{HEAD}
workers: [lab{WORKER}]
backend: native
master_port: 29591
"""


def sh(i: int, command: str) -> str:
    code, out, err = lab.run(i, command)
    assert code == 0, f"lab{i}: {command}: {err}"
    return out


@pytest.fixture(scope="module")
def group(lab_hosts: list[lab.HostStatus], tmp_path_factory: pytest.TempPathFactory,
          ) -> NodeGroup:
    lab.up(max(HEAD, WORKER))  # hosts already running stay as they are
    inv = linked_inventory(tmp_path_factory.mktemp("group"), HOSTS_YML,
                           {"tiny-pp2.yml": GROUP_YML})
    return resolve_group(inventory.load(inv), "tiny-pp2", operator_env={})


# The unit's processes, by the cgroup each one is in (cgroup v1 and v2 alike): the API
# server, the ranks, multiprocessing's resource tracker and spawned children, whatever
# their command lines say.
IN_UNIT = f"grep -lF '/{UNIT}.service' /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3"


def _stop(i: int) -> None:
    """Stopped means the unit inactive and no process left in its cgroup: a start while
    one still exits fails with 219/CGROUP on the lab's cgroup v1 (seen in CI under load,
    where a wait on the API server's command line alone ended too early)."""
    code, out, err = lab.run(
        i, f"systemctl stop {UNIT}; for n in $(seq 180); do "
        f"[ -z \"$({IN_UNIT})\" ] && break; sleep 1; done; "
        f"left=$({IN_UNIT}); systemctl reset-failed {UNIT} 2>/dev/null; "
        f"[ -z \"$left\" ] || {{ echo \"left in {UNIT}: $left\"; "
        "ps -o pid,stat,etimes,args -p $(echo $left | tr ' ' ,); exit 1; }",
        timeout=240)
    assert code == 0, f"lab{i}: stop {UNIT}: {out} {err}"


def _start(i: int) -> None:
    """systemctl start, and on failure systemd's own account of why (the unit's status
    and journal), so a failed start names its cause."""
    code, _, err = lab.run(i, f"systemctl start {UNIT}", timeout=120)
    if code != 0 and _cgroup_refused(i):
        # The lab's cgroup v1 under load: systemd could not clear the last run's cgroup
        # ("Failed to kill control group ...: Input/output error") and the start exits
        # 219/CGROUP. The unit's Restart= tries again by itself (restart_sec 5): follow it
        # until a start goes through, as an operator's host would.
        code = lab.run(i, f"for n in $(seq 36); do [ \"$(systemctl is-active {UNIT})\" = "
                          f"active ] && exit 0; sleep 5; done; exit 1", timeout=240)[0]
    if code != 0:
        _, why, _ = lab.run(i, f"systemctl status --no-pager -l {UNIT}; "
                               f"journalctl -u {UNIT} -n 30 --no-pager", timeout=60)
        raise AssertionError(f"lab{i}: systemctl start {UNIT}: {err}\n{why}")


def _cgroup_refused(i: int) -> bool:
    """The failed start was 219/CGROUP and systemd is retrying it (or already did)."""
    out = lab.run(i, f"systemctl show -p ExecMainStatus -p SubState -p ActiveState {UNIT}; "
                     f"journalctl -u {UNIT} -n 20 --no-pager", timeout=60)[1]
    return "status=219/CGROUP" in out and (
        "SubState=auto-restart" in out or "ActiveState=active" in out)


def _stop_all() -> None:
    """Every node at once (no rank waits for another's stop to end), then wait until the
    ranks' processes are gone: a unit started again while the last run's processes still
    exit fails with 219/CGROUP."""
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(_stop, (HEAD, WORKER)))


@pytest.fixture(scope="module", autouse=True)
def stopped_afterwards() -> object:
    yield None
    _stop_all()  # two idle vLLM ranks would take the lab's CPU from the next test
    for i in (HEAD, WORKER):  # nor start again when the lab host boots
        lab.run(i, f"systemctl disable {UNIT}")


def test_group_serves_a_completion_through_the_head(group: NodeGroup, tmp_path: Path,
                                                    ) -> None:
    out = io.StringIO()
    result = deploy_group(group, Options(restart=True, wait=False, state_dir=tmp_path),
                          Log(out))
    lines = out.getvalue()
    assert result.status == "changed", lines
    assert [s.node for s in result.plan.steps] == [
        f"lab{HEAD}", f"lab{WORKER}"] if result.plan else False
    assert all(s.restart for s in result.plan.steps) if result.plan else False
    seen: list[GroupState] = []
    watch = verify_group(group, Settings(poll_s=3, stall_s=240), on_poll=seen.append,
                         deadline_s=900)
    final = watch.history[-1]
    assert final.verdict == "ready", (final, lines)
    assert final.joined == (f"lab{HEAD}", f"lab{WORKER}") and final.missing == ()
    head = watch.nodes[f"lab{HEAD}"].state
    assert head.verdict == "ready"
    # the real completion went through the head's API server (vLLM's own fingerprint
    # says pp2: both stages answered)
    worker_log = sh(WORKER, f"journalctl -u {UNIT} -b --no-pager -o cat | tail -400")
    assert "headless multiproc executor" in worker_log
    assert "127.0.0.1:29591" in worker_log
    reply = sh(HEAD, "curl -s http://127.0.0.1:8191/v1/completions -H 'Content-Type: "
               "application/json' -d '{\"model\": \"tiny\", \"prompt\": \"hello\", "
               "\"max_tokens\": 4}'")
    assert '"text"' in reply and "pp2" in reply, reply
    # while starting, the group showed which nodes had joined
    assert any(s.phase in ("bootstrap", "engine_init", "distributed_init", "loading_weights")
               for s in seen)


# Release B: a change on every node (an env variable the group's vars add) and, on the
# worker only, VLLM_LOGGING_LEVEL=VERBOSE, a level Python's logging does not know:
# vLLM's CLI raises at start there (`ValueError: Unknown level: 'VERBOSE'`, ~13 s into
# the start on 2 cores) while the head waits for it in distributed_init.
BROKEN_HOSTS_YML = HOSTS_YML.replace(
    "port: 8192}", "port: 8192, env: {VLLM_LOGGING_LEVEL: VERBOSE}}").replace(
    "      restart_sec: 5\n", "      restart_sec: 5\n      env: {VIGIL_LAB_RELEASE: b}\n")


def _release(node: str, group: NodeGroup) -> str:
    """A node's release as its files say: the unit and the env file."""
    n = next(n for n in group.nodes if n.name == node)
    paths = n.target.rendered.paths
    return sh(int(node.removeprefix("lab")), f"cat {paths.unit} {paths.env}")


def test_a_failure_on_one_node_rolls_every_node_back(group: NodeGroup, tmp_path: Path,
                                                     ) -> None:
    """From release A on both nodes (the first test's deploy), the front door
    `group.deploy --rollback-failed` deploys release B, which changes both nodes and
    breaks the worker's start: the group crashes naming the worker, and every node this deploy
    replaced goes back, the head first, then the worker. Then both nodes hold release A's
    unit and env file again and the group verifies ready on them."""
    out = io.StringIO()
    a = deploy_group(group, Options(wait=False, state_dir=tmp_path), Log(out))
    assert a.status in ("ok", "changed"), out.getvalue()  # ok after the first test
    release_a = {n: _release(n, group) for n in group.names}
    inv = linked_inventory(tmp_path, BROKEN_HOSTS_YML, {"tiny-pp2.yml": GROUP_YML})
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "invoke"), "group.deploy", "--name", "tiny-pp2",
         "--rollback-failed"], cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "INVOKE_VIGIL_INVENTORY": str(inv),
             "INVOKE_VIGIL_STATE_DIR": str(tmp_path / "state")})
    lines = proc.stdout + proc.stderr
    print(lines)
    assert proc.returncode == ExitCode.CRASHED, lines
    assert f"apply lab{WORKER} (restart): changed" in lines
    assert f"apply lab{HEAD} (restart): changed" in lines
    assert f"CRASHED on lab{WORKER}" in lines
    assert f"proof: lab{WORKER}: ValueError: Unknown level: 'VERBOSE'" in lines
    assert f"the group did not come up: rolling back lab{HEAD}, lab{WORKER}" in lines, lines
    # every node holds release A again, not only the one that failed
    assert {n: _release(n, group) for n in group.names} == release_a
    assert "VLLM_LOGGING_LEVEL='INFO'" in release_a[f"lab{WORKER}"]
    # ... and the rollback restarted the head first, then the worker (the lab hosts share
    # the machine's kernel: monotonic stamps compare across hosts). Worker first, the
    # restored worker once joined the old head during its ~30 s stop and hung in kv_cache
    # while the restored head waited for it: stalled in distributed_init.
    head = _since_boot_us(HEAD, UNIT, "ExecMainStartTimestampMonotonic")
    worker = _since_boot_us(WORKER, UNIT, "ExecMainStartTimestampMonotonic")
    assert 0 < head < worker, (head, worker)
    final = verify_group(group, Settings(poll_s=3, stall_s=240), deadline_s=600).history[-1]
    assert final.verdict == "ready", final
    assert final.joined == (f"lab{HEAD}", f"lab{WORKER}")
    # the release B each node kept is the one a second rollback would bring back
    backup = next(n for n in group.nodes
                  if n.name == f"lab{WORKER}").target.rendered.paths.backup_dir
    assert "VIGIL_LAB_RELEASE='b'" in sh(WORKER, f"cat {backup}/env")


def test_a_missing_worker_stalls_then_a_killed_worker_crashes_naming_it(
        group: NodeGroup) -> None:
    """One head start, two faults. The worker's unit is not started: the head waits in
    distributed_init and the group is stalled there naming the worker (this test's stall window
    is 40 s for every phase instead of the defaults: the head's quiet wait at the
    barrier is the only quiet a start of the tiny model has). Then the worker starts late and
    joins the waiting head; once joined, its engine (vLLM's main process and its rank) is
    SIGKILLed while it loads: the group is crashed naming the worker."""
    _stop_all()
    _start(HEAD)  # the worker's unit stays stopped
    stalled = verify_group(group, Settings(poll_s=3, stall_s=40), deadline_s=600).history[-1]
    assert stalled.verdict == "stalled", stalled
    assert stalled.phase == "distributed_init" and stalled.node == f"lab{WORKER}", stalled
    assert f"lab{WORKER}" in stalled.missing and f"lab{WORKER}" not in stalled.joined
    assert stalled.proof is not None and f"lab{WORKER}: unit not running" in stalled.proof

    killed = threading.Event()

    def kill_during_load(gs: GroupState) -> None:
        if not killed.is_set() and f"lab{WORKER}" in gs.joined:
            # the node's engine: its main process and every process it spawned (its rank),
            # at once (as a node's OOM kill or crash would; `systemctl kill` errors on the
            # lab's cgroup v1). Only the ranks killed, vLLM's main process first logs its
            # executor's "[shutdown]", which the reducer reads as an orderly stop.
            sh(WORKER, f"m=$(systemctl show -p MainPID --value {UNIT}); "
               "kill -KILL $m $(pgrep -P $m)")
            killed.set()

    _start(WORKER)
    watch = verify_group(group, Settings(poll_s=2, stall_s=240), on_poll=kill_during_load,
                         deadline_s=600)
    final = watch.history[-1]
    assert killed.is_set(), final
    assert final.verdict == "crashed", final
    assert final.node == f"lab{WORKER}" and final.proof is not None and final.proof.startswith(
        f"lab{WORKER}:"), final


# -- the Ray backend: vigil deploys the cluster, vLLM's CPU build refuses it --------------

# The Ray nodes install with uv (installer: uv below), whose cache lives in each host's
# /var/cache/vigil: an env_root on that mount lets uv hardlink the ~3.4 GB of vLLM instead
# of copying them (its own `current`, so the hosts' vllm.service environments under
# /opt/vigil/envs are untouched).
RAY_HEAD, RAY_WORKER = 7, 6
RAY_UNIT = "vllm-rg"
RAY_ENV_ROOT = "/var/cache/vigil/envs"
RAY_HOSTS_YML = f"""
hosts:
  lab{RAY_HEAD}: {{address: 127.0.0.1, ssh_port: {lab.host_port(RAY_HEAD)}, port: 8193}}
  lab{RAY_WORKER}: {{address: 127.0.0.1, ssh_port: {lab.host_port(RAY_WORKER)}, port: 8194}}
groups:
  raypair:
    hosts: [lab{RAY_HEAD}, lab{RAY_WORKER}]
    vars:
      ssh_user: root
      ssh_key: {lab.key_path()}
      known_hosts: {lab.known_hosts_path()}
      connect_timeout_s: 5
      service: {RAY_UNIT}
      model: tiny-cpu
      stack: lab-cpu-ray
      env_root: {RAY_ENV_ROOT}
      installer: uv
      restart_sec: 60  # one refused start to judge, not a restart loop
      timeout_stop_s: 20
      overrides: {{pipeline_parallel_size: 2}}
"""
RAY_GROUP_YML = f"""
description: the tiny model on a Ray cluster of two lab hosts (vLLM's CPU build refuses it)
head: lab{RAY_HEAD}
workers: [lab{RAY_WORKER}]
backend: ray
ray_port: 6390
master_port: 29592
prove_cpu_ray_refusal: true
"""
RAY_UNITS = {RAY_HEAD: (RAY_UNIT, f"{RAY_UNIT}-ray"), RAY_WORKER: (f"{RAY_UNIT}-ray",)}


def _ray_stop() -> None:
    """Every node at once (systemd stops vLLM before the head's Ray unit): a Ray worker
    drains at once while the head is up, and waits out its TimeoutStopSec once it is gone.
    The head's stop takes ~30 s: vLLM's API server outlives its refused engine core."""
    def stop(i: int) -> None:
        units = " ".join(RAY_UNITS[i])
        code, _, err = lab.run(i, f"systemctl stop {units}; systemctl disable {units}; "
                               f"systemctl reset-failed {units} 2>/dev/null; true", timeout=120)
        assert code == 0, f"lab{i}: {err}"
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(stop, RAY_UNITS))


@pytest.fixture(scope="module")
def ray_group(lab_hosts: list[lab.HostStatus], tmp_path_factory: pytest.TempPathFactory,
              ) -> Iterator[NodeGroup]:
    if not {f"lab{RAY_HEAD}", f"lab{RAY_WORKER}"} <= {h.name for h in lab.status()
                                                       if h.running}:
        lab.up(RAY_HEAD)  # hosts already running stay as they are
    for i in RAY_UNITS:
        wheels.install_uv(i)
    inv = linked_inventory(tmp_path_factory.mktemp("raygroup"), RAY_HOSTS_YML,
                           {"tiny-ray.yml": RAY_GROUP_YML})
    yield resolve_group(inventory.load(inv), "tiny-ray", operator_env={})
    _ray_stop()


def _since_boot_us(i: int, unit: str, prop: str) -> int:
    # the lab hosts share the machine's kernel: monotonic stamps compare across hosts
    return int(sh(i, f"systemctl show -p {prop} --value {unit}").strip())


def test_a_ray_group_forms_its_cluster_and_the_cpu_build_refuses_it(
        ray_group: NodeGroup, tmp_path: Path) -> None:
    """group.deploy of a 2-node Ray group: the Ray head's unit, the worker's, then vLLM on
    the head; verify's Ray check sees both nodes alive; vLLM on the head connects to the
    cluster and refuses it with its own error: crashed (executor_unsupported) naming the
    head. Then the group stops with nothing of it left running."""
    out = io.StringIO()
    result = deploy_group(ray_group, Options(restart=True, wait=False, state_dir=tmp_path),
                          Log(out))
    lines = out.getvalue()
    print(lines)  # the install lines carry their seconds
    assert result.status == "changed", lines
    assert result.plan is not None
    assert [s.key for s in result.plan.steps] == [
        f"lab{RAY_HEAD}/ray", f"lab{RAY_WORKER}/ray", f"lab{RAY_HEAD}"]
    # the group tasks say this note first (tests/unit/test_groups.py); the library does not
    assert any("vLLM will refuse this group at engine start" in n for n in ray_group.notes)
    seen: list[GroupState] = []
    watch = verify_group(ray_group, Settings(poll_s=3, stall_s=240), on_poll=seen.append,
                         deadline_s=600)
    final = watch.history[-1]
    print("\n".join(s.summary for s in seen))
    assert final.verdict == "crashed", final
    assert final.cause == "executor_unsupported" and final.node == "lab7", final
    assert final.proof is not None and final.proof.startswith("lab7:"), final
    assert "current platform cpu does not support ray." in final.proof
    # verify's Ray check (ray.nodes() on the head) saw the cluster whole
    assert any(s.ray is not None and s.ray.alive == 2 for s in seen), seen
    # in order: the Ray head up before the worker's Ray started, both before vLLM
    head_ray = _since_boot_us(RAY_HEAD, f"{RAY_UNIT}-ray", "ActiveEnterTimestampMonotonic")
    worker_ray = _since_boot_us(RAY_WORKER, f"{RAY_UNIT}-ray", "ExecMainStartTimestampMonotonic")
    vllm = _since_boot_us(RAY_HEAD, RAY_UNIT, "ExecMainStartTimestampMonotonic")
    assert 0 < head_ray <= worker_ray < vllm, (head_ray, worker_ray, vllm)
    # vLLM's refusal leaves the cluster up: Ray's own API on the head, as verify asks it
    nodes = sh(RAY_HEAD, f"{ray_group.head.target.rendered.paths.python} -c "
               f"{shlex.quote(RAY_NODES)} 127.0.0.1:6390")
    print(nodes)
    assert ray_alive_nodes(nodes) == 2, nodes
    _ray_stop()
    for i in RAY_UNITS:
        # every process of the group runs from its environment ([s]: not this shell)
        left = lab.run(i, f"pgrep -a -f '{RAY_ENV_ROOT[:-1]}[s]/' || true")[1]
        assert left.strip() == "", f"lab{i}: {left}"
