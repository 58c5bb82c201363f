"""The agent's probe verb, run for real the way SSH runs it: `python3 -c AGENT probe`,
the request as JSON on stdin.

systemd is not PID 1 here, so systemctl/journalctl/nvidia-smi are small fakes on PATH
that print what the real tools print; /proc, the cache walk and HTTP are real.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tests.paths import FIXTURES
from vigil.transport import remote
from vigil.verify.snapshot import Snapshot


def run_probe(path: str | None = None, env: dict[str, str] | None = None,
              **request: object) -> Snapshot:
    """The agent's probe verb as SSH runs it: the bootstrap on the command line, the agent
    and then the request on stdin."""
    e = dict(os.environ)
    e["PATH"] = path if path is not None else "/nonexistent"
    e.update(env or {})
    out = subprocess.run([sys.executable, "-c", remote.BOOTSTRAP, "probe"],
                         input=remote.agent_stdin(json.dumps(request)).encode(),
                         capture_output=True, timeout=30,
                         env=e, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stderr == b""  # never a traceback
    return Snapshot.from_json(out.stdout)


def test_agent_is_stdlib_only_and_python38() -> None:
    # the script a host runs: every part of vigil/host/ joined
    tree = ast.parse(remote.agent_source(), feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert "vigil" not in imported
    allowed = set(sys.stdlib_module_names) | {"pynvml", "__future__"}
    assert imported <= allowed, imported - allowed


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[bytes]]:
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        yield parent
    finally:
        assert parent.stdout is not None
        parent.kill()
        parent.wait()


def test_process_tree_cpu_state_rss(tree: subprocess.Popen[bytes]) -> None:
    assert tree.stdout is not None
    child = int(tree.stdout.readline())
    try:  # until the child has burnt some CPU (however loaded this machine is)
        for _ in range(100):
            snap = run_probe(pid=tree.pid, no_nvml=True)
            items = snap.processes.items if snap.processes is not None else ()
            if any(p.pid == child and p.cpu_s > 0.2 for p in items):
                break
            time.sleep(0.3)
    finally:
        os.kill(child, 9)
    assert snap.processes is not None and snap.processes.source == "proc-tree"
    procs = {p.pid: p for p in snap.processes.items}
    assert set(procs) == {tree.pid, child}
    assert procs[child].ppid == tree.pid
    assert procs[child].state == "R" and procs[child].cpu_s > 0.2
    assert procs[child].rss_bytes > 1_000_000 and "while True" in procs[child].cmdline
    assert snap.unit is None and snap.http is None


def test_cache_walk(tmp_path: Path) -> None:
    d = tmp_path / "torch_compile_cache" / "ab" / "rank_0_0"
    d.mkdir(parents=True)
    (d / "a.py").write_bytes(b"x" * 1000)
    (d / "b.so").write_bytes(b"y" * 24)
    os.utime(d / "b.so", (1_700_000_000, 1_700_000_000))
    os.utime(d / "a.py", (1_700_000_500, 1_700_000_500))
    snap = run_probe(cache_dirs=[str(tmp_path / "torch_compile_cache"),
                                 str(tmp_path / "missing")], no_nvml=True)
    assert snap.cache is not None
    present, missing = snap.cache.dirs
    assert (present.exists, present.files, present.bytes) == (True, 2, 1024)
    assert present.newest_mtime == 1_700_000_500
    assert (missing.exists, missing.files) == (False, 0)
    assert snap.cache.readable


def test_default_cache_dirs_follow_vllm_cache_root(tmp_path: Path) -> None:
    snap = run_probe(user="root", no_nvml=True, env={"VLLM_CACHE_ROOT": str(tmp_path)})
    assert snap.cache is not None
    paths = [d.path for d in snap.cache.dirs]
    assert paths == [str(tmp_path / "torch_compile_cache"), "/tmp/torchinductor_root"]


class _Vllm(BaseHTTPRequestHandler):
    health = 200
    seen_auth: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(self.health)
            self.end_headers()
        elif self.path == "/v1/models":
            type(self).seen_auth.append(self.headers.get("Authorization", ""))
            body = json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Vllm)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    _Vllm.health = 200


def test_http_health_and_models_with_api_key(server: ThreadingHTTPServer) -> None:
    port = server.server_address[1]
    snap = run_probe(port=port, api_key="s3cret", no_nvml=True)
    assert snap.http is not None
    assert snap.http.health_status == 200 and snap.http.models == ("tiny",)
    assert _Vllm.seen_auth[-1] == "Bearer s3cret"


def test_http_503_is_a_status_not_an_error(server: ThreadingHTTPServer) -> None:
    _Vllm.health = 503
    snap = run_probe(port=server.server_address[1], no_nvml=True)
    assert snap.http is not None and snap.http.health_status == 503
    assert snap.http.health_error is None


def test_http_refused_is_an_error_field() -> None:
    snap = run_probe(port=1, no_nvml=True)
    assert snap.http is not None and snap.http.health_status is None
    assert snap.http.health_error and "refused" in snap.http.health_error.lower()
    assert snap.http.models is None


def test_no_nvml_no_nvidia_smi_is_null() -> None:
    assert run_probe(no_nvml=True).gpus is None


def _fake(bin_dir: Path, name: str, script: str) -> None:
    p = bin_dir / name
    p.write_text("#!" + sys.executable + "\n" + script)
    p.chmod(0o755)


def test_nvidia_smi_fallback_reads_the_facts_query_by_field_name(tmp_path: Path) -> None:
    """Without NVML the probe reads the one nvidia-smi query the facts use (headers kept,
    units in the values), here answered with lines of the real H200 capture."""
    fix = FIXTURES / "gpus" / "h200"
    gpus = fix / "query_gpu.csv"
    apps = fix / "compute_apps.csv"
    _fake(tmp_path, "nvidia-smi", (
        "import sys\n"
        "if any('query-gpu' in a for a in sys.argv):\n"
        f"    sys.stdout.write(open({str(gpus)!r}).read())\n"
        "elif any('query-compute-apps' in a for a in sys.argv):\n"
        f"    sys.stdout.write(open({str(apps)!r}).read())\n"))
    snap = run_probe(no_nvml=True, path=str(tmp_path))
    assert snap.gpus is not None and snap.gpus.source == "nvidia-smi", snap.gpus
    (gpu,) = snap.gpus.devices
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (143771.0, 32362.0)
    assert len(gpu.processes) == 3 and gpu.processes[0].used_mib == 2566.0


def test_systemd_unit_and_journal(tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    assert tree.stdout is not None
    child = int(tree.stdout.readline())
    _fake(tmp_path, "systemctl", (
        "print('ActiveState=activating')\nprint('SubState=start')\n"
        f"print('MainPID={tree.pid}')\nprint('NRestarts=2')\nprint('ExecMainStatus=0')\n"
        "import time\n"
        "print('ExecMainStartTimestampMonotonic=%d' % "
        "int((time.clock_gettime(time.CLOCK_MONOTONIC) - 30) * 1e6))\n"
        "print('ControlGroup=/system.slice/nope.service')\n"))
    args_file = tmp_path / "journal-args"
    _fake(tmp_path, "journalctl", (
        "import json, sys, time\n"
        f"open({str(args_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "msgs = ['Starting to load model /m...', list('Model loading took 1 GiB'.encode()),\n"
        "        None, 'line three\\nline four']\n"
        "for i, m in enumerate(msgs):\n"
        "    print(json.dumps({'__CURSOR': 'c%d' % i, "
        "'__REALTIME_TIMESTAMP': str(int(time.time() * 1e6) + i), 'MESSAGE': m}))\n"))
    try:
        snap = run_probe(unit="vllm.service", cursor="c-old", no_nvml=True,
                         path=str(tmp_path))
        first = run_probe(unit="vllm.service", max_lines=2, no_nvml=True, path=str(tmp_path))
        first_args = json.loads(args_file.read_text())
    finally:
        os.kill(child, 9)
    u = snap.unit
    assert u is not None and u.error is None
    assert (u.active_state, u.main_pid, u.n_restarts) == ("activating", tree.pid, 2)
    assert u.exec_main_start_epoch == pytest.approx(time.time() - 30, abs=5)
    texts = [ln.text for ln in snap.journal.lines]
    assert texts == ["Starting to load model /m...", "Model loading took 1 GiB",
                     "line three", "line four"]
    assert snap.journal.cursor == "c3" and not snap.journal.truncated
    # No cgroup dir here: the tree under MainPID stands in.
    assert snap.processes is not None and snap.processes.source == "proc-tree"
    assert {p.pid for p in snap.processes.items} == {tree.pid, child}
    # First poll: last N lines since the unit's start; cut at --max-lines with the cursor
    # of the last line kept.
    assert "-n" in first_args and "--since" in first_args and "--after-cursor" not in first_args
    assert len(first.journal.lines) == 2 and first.journal.truncated
    assert first.journal.cursor == "c1"


def test_never_raises_without_systemd() -> None:
    snap = run_probe(unit="vllm.service", port=1, no_nvml=True)
    assert snap.unit is not None and snap.unit.error
    assert snap.journal.error and snap.journal.lines == ()
    assert snap.processes is not None and snap.processes.items == ()


def test_bad_request_values_still_give_a_snapshot() -> None:
    snap = run_probe(port="notanumber", max_lines="x", pid="y", no_nvml=True)
    assert snap.http is None and snap.processes is not None and snap.processes.items == ()


# -- starvation facts: the kernel's own text, parsed (issue 28, the live window) ----------

# cgroup v2 cpu.stat of a unit with CPUQuota=40% (kernel 6.1; nr_bursts/burst_usec since
# 5.14, core_sched.force_idle_usec since 5.18)
CPU_STAT_V2 = """\
usage_usec 8392847
user_usec 6129033
system_usec 2263814
core_sched.force_idle_usec 0
nr_periods 1024
nr_throttled 634
throttled_usec 18372663
nr_bursts 0
burst_usec 0
"""
# cgroup v2 cpu.stat without a quota: no bandwidth counters at all
CPU_STAT_V2_NO_QUOTA = "usage_usec 412\nuser_usec 300\nsystem_usec 112\n"
# cgroup v1 cpu controller's cpu.stat (throttled_time in ns), cpuacct.usage in ns
CPU_STAT_V1 = "nr_periods 1024\nnr_throttled 634\nthrottled_time 18372663421\n"
# PSI: /proc/pressure/cpu (the full line since 5.13, zero system-wide) and cpu.pressure
PRESSURE = ("some avg10=61.84 avg60=48.27 avg300=20.15 total=182736451\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
PROC_STAT = """\
cpu  10132153 290696 3084719 46828483 16683 0 25195 175628 0 0
cpu0 1393280 32966 572056 13343292 6080 0 17875 43907 0 0
intr 199292711 26 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0 0 0 0 0
ctxt 323218218
btime 1733300000
"""


def test_cgroup_cpu_stat_v2_and_v1_read_as_the_same_counters() -> None:
    from vigil.host import probe
    v2 = probe.parse_cpu_stat(CPU_STAT_V2)
    assert v2 == {"nr_periods": 1024, "nr_throttled": 634, "throttled_us": 18372663,
                  "usage_us": 8392847}
    v1 = probe.parse_cpu_stat(CPU_STAT_V1)
    assert v1 == {"nr_periods": 1024, "nr_throttled": 634, "throttled_us": 18372663}
    assert probe.parse_cpu_stat(CPU_STAT_V2_NO_QUOTA) == {"usage_us": 412}
    assert probe.parse_cpu_stat(None) is None
    assert probe.parse_cpu_stat("garbage\n") is None


def test_pressure_and_steal_are_read_from_the_kernels_text() -> None:
    from vigil.host import probe
    assert probe.parse_pressure(PRESSURE) == 182736451
    assert probe.parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") == 0
    assert probe.parse_pressure({"error": "permission denied"}) is None  # type: ignore[arg-type]
    assert probe.parse_pressure("") is None
    ticks = probe.parse_proc_stat(PROC_STAT)
    assert ticks == {"steal_ticks": 175628,
                     "total_ticks": 10132153 + 290696 + 3084719 + 46828483 + 16683 + 0
                     + 25195 + 175628}
    assert probe.parse_proc_stat("cpu0 1 2 3\n") is None


@pytest.mark.parametrize(("layout", "version"), [
    ({"": CPU_STAT_V2}, "v2"),
    ({"cpu,cpuacct": CPU_STAT_V1}, "v1"),
    ({"cpu": CPU_STAT_V1}, "v1"),
])
def test_the_units_cgroup_is_found_on_v2_and_v1(
        monkeypatch: pytest.MonkeyPatch, layout: dict[str, str], version: str) -> None:
    from vigil.host import probe
    cg = "/system.slice/vllm.service"
    files = {f"/sys/fs/cgroup/{k}{cg}/cpu.stat".replace("//", "/"): v
             for k, v in layout.items()}
    files[f"/sys/fs/cgroup{cg}/cpu.pressure"] = PRESSURE
    files["/sys/fs/cgroup/cpu,cpuacct" + cg + "/cpuacct.usage"] = "8392847123\n"
    files["/sys/fs/cgroup/cpu" + cg + "/cpuacct.usage"] = "8392847123\n"
    files["/proc/pressure/cpu"] = PRESSURE
    files["/proc/stat"] = PROC_STAT
    monkeypatch.setattr(probe, "read_text", files.get)
    load = probe.cpu_load(cg)
    assert load["cgroup"] == version and load["error"] is None
    assert (load["nr_periods"], load["nr_throttled"]) == (1024, 634)
    assert load["usage_us"] == 8392847
    assert load["host_pressure_some_us"] == 182736451 and load["steal_ticks"] == 175628
    assert ("pressure_some_us" in load) == (version == "v2")
    Snapshot.from_dict({"time": 1.0, "cpu_load": load})  # the watcher's type reads it


def test_the_probe_reports_the_hosts_cpu_load() -> None:
    snap = run_probe(pid=os.getpid())
    load = snap.cpu_load
    assert load is not None and load.error is None
    if os.path.exists("/proc/stat"):
        assert load.total_ticks is not None and load.total_ticks > 0
