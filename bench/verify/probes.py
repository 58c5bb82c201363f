"""Four probes on the same starts: vigil streaming, vigil polling, a `curl /health` loop and
a fixed-budget startup probe (issue 13 item 6).

    .venv/bin/python -m bench.verify.probes --host lab5 --index 5 --crashes 5

Each start is watched at once by vigil streaming (`--probe stream`, which injects the
fault), vigil polling (`--probe poll`, 5 s), the shell loop (`curl /health` every 30 s,
20 tries) and the startup probe (/health every 10 s, threshold 120), the last two ON the
host as in bench.py.

- ready: a warm start. Also: the first /health 200 (a 50-ms curl loop on the host) to the
  moment each vigil watcher STARTS its smoke completion.
- crashed, `--crashes` times: kill -9 of the engine core once it loads or compiles ->
  each watcher's verdict, from the kill (controller clock = host clock: the lab host is a
  container on this machine).
- the stream's host CPU: the stream process and its `journalctl -f` (utime+stime from
  /proc) over a whole start and over 30 s of a serving server, as a share of one core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.verify.bench import BUDGET, SHELL_LOOP, STARTUP_PROBE, STOP, Loop, sh
from vigil.desired import inventory
from vigil.desired import targets as targets_mod
from vigil.verify import reducer, watch
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Smoke, Snapshot

ROOT = Path(__file__).resolve().parents[2]

# CPU seconds and age of every stream process on the host and its journalctl -f child.
STREAM_CPU = r"""
import os
tck = os.sysconf("SC_CLK_TCK"); up = float(open("/proc/uptime").read().split()[0])
stat = {}
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            s = open("/proc/%s/stat" % d).read(); a = open("/proc/%s/cmdline" % d, "rb").read()
        except OSError:
            continue
        f = s[s.rfind(")") + 2:].split()
        stat[int(d)] = (int(f[1]), (int(f[11]) + int(f[12])) / tck, up - int(f[19]) / tck,
                        a.split(b"\0"))
for pid, (ppid, cpu, age, argv) in stat.items():
    if len(argv) > 3 and argv[1] == b"-c" and argv[-2] == b"stream":
        kids = sum(c for p, (pp, c, _, _) in stat.items() if pp == pid)
        print(pid, round(cpu, 3), round(kids, 3), round(age, 3))
"""

HEALTH_200 = ("for i in $(seq 6000); do curl -sf -o /dev/null http://127.0.0.1:PORT/health "
              "&& { date +%s.%N; exit 0; }; sleep 0.05; done; echo never")

SMOKE_STARTS: dict[bool, list[float]] = {True: [], False: []}
_orig_smoke = watch.Poller.smoke


def _timed_smoke(self: watch.Poller) -> Smoke:
    SMOKE_STARTS[self.settings.stream].append(time.time())
    return _orig_smoke(self)


watch.Poller.smoke = _timed_smoke  # type: ignore[method-assign]


def stream_cpu(index: int) -> list[dict[str, float]]:
    out = sh(index, f"python3 -c '{STREAM_CPU}'")
    rows = []
    for line in out.splitlines():
        pid, cpu, kids, age = line.split()
        rows.append({"pid": int(pid), "cpu_s": float(cpu), "journalctl_cpu_s": float(kids),
                     "age_s": float(age)})
    return rows


def one_start(host: str, index: int, fault: str | None) -> dict[str, Any]:
    t = targets_mod.resolve(inventory.load(ROOT / "inventory"), host)[0]
    port = str(t.vars.port)
    sh(index, f"{STOP}; pkill -f '[v]igil-bench-loop' || true")
    for v in SMOKE_STARTS.values():
        v.clear()
    sh(index, "systemctl start vllm")
    t_start = time.time()
    loops = [Loop(index, n, s.replace("PORT", port))
             for n, s in zip(BUDGET, (SHELL_LOOP, STARTUP_PROBE), strict=True)]
    health: list[str] = []
    h = threading.Thread(target=lambda: health.append(
        sh(index, f"timeout 400 bash -c '{HEALTH_200.replace('PORT', port)}'")), daemon=True)
    if fault is None:
        h.start()
    for lp in loops:
        lp.start()
    killed: list[float] = []
    verdict_at: dict[str, float] = {}
    cpu: list[dict[str, float]] = []

    def hook(name: str, inject: bool) -> Any:
        def on_poll(_h: str, st: reducer.WatchState, snap: Snapshot, b: Budgets) -> None:
            if inject and fault == "kill9" and not killed and snap.processes is not None \
                    and st.phase in ("loading_weights", "compiling", "kv_cache"):
                main = st.main_pid or (snap.unit.main_pid if snap.unit else 0)
                engine = next((p.pid for p in snap.processes.items
                               if "EngineCor" in p.comm and p.ppid == main), None)
                if engine:
                    sh(index, f"kill -9 {engine}")
                    killed.append(time.time())
            if st.verdict in reducer.TERMINAL and name not in verdict_at:
                verdict_at[name] = time.time()
                if inject:
                    cpu.extend(stream_cpu(index))
        return on_poll

    outs: dict[str, watch.Outcome] = {}

    def run(name: str, stream: bool) -> None:
        settings = watch.Settings(poll_s=5.0, stream=stream)
        outs[name] = watch.verify_target(t, settings, ROOT / "state" / "bench" / name,
                                         on_poll=hook(name, stream))

    threads = [threading.Thread(target=run, args=(n, s)) for n, s in
               (("vigil stream", True), ("vigil poll", False))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for lp in loops:
        lp.join(timeout=45 if fault is None else 1)
    results = {lp.name_: lp.result for lp in loops}
    sh(index, "pkill -f '[v]igil-bench-loop' || true")
    if fault is None:
        h.join(timeout=5)
    sh(index, STOP)
    origin = killed[0] if killed else t_start
    row: dict[str, Any] = {"fault": fault, "measured_from": "kill -9" if killed
                           else "systemctl start"}
    for name, out in outs.items():
        row[name] = {"verdict": out.verdict, "cause": out.state.cause if out.state else None,
                     "seconds": round(verdict_at.get(name, time.time()) - origin, 2),
                     "snapshots": out.state.polls if out.state else 0,
                     "streamed": out.streamed, "error": out.error}
    for lp in loops:
        res = results[lp.name_]
        if res is not None and res[0] == "READY":
            row[lp.name_] = {"verdict": "ready",
                             "seconds": round(t_start + res[1] - origin, 1)}
        else:
            row[lp.name_] = {"verdict": "failed (at its budget)", "derived": True,
                             "seconds": round(t_start + BUDGET[lp.name_] - origin, 1)}
    if fault is None and health and health[0].strip() != "never":
        first_200 = float(health[0].strip())
        row["health_200_to_smoke_start_s"] = {
            ("vigil stream" if k else "vigil poll"): round(v[0] - first_200, 3)
            for k, v in SMOKE_STARTS.items() if v}
    if cpu:
        row["stream_cpu_at_verdict"] = cpu
    return row


def steady_cost(host: str, index: int, seconds: float = 30.0) -> dict[str, Any]:
    """The stream on a serving server: its CPU over `seconds`, per core."""
    from vigil.transport.base import privileged
    from vigil.transport.ssh import connect

    t = targets_mod.resolve(inventory.load(ROOT / "inventory"), host)[0]
    sh(index, "systemctl start vllm")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if "200" in sh(index, "curl -s -o /dev/null -w '%{http_code}' "
                              f"http://127.0.0.1:{t.vars.port}/health || true"):
            break
        time.sleep(2)
    target = watch.ProbeTarget(t.vars.service, t.vars.port, t.vars.service_user,
                               t.rendered.paths.cache, t.rendered.paths.python, "tiny")
    with connect(host, t.vars) as transport:
        poller = watch.Poller(transport, target, lambda c: privileged(c, t.vars))
        s = poller.streamer(lambda m: None, t.vars.poll_s)
        first = poller.probe(None)
        s(first.journal.cursor)
        before = stream_cpu(index)
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            s(None)
            n += 1
        after = stream_cpu(index)
        s.close()
    sh(index, STOP)
    b, a = before[0], after[0]
    cpu = (a["cpu_s"] - b["cpu_s"]) + (a["journalctl_cpu_s"] - b["journalctl_cpu_s"])
    wall = a["age_s"] - b["age_s"]
    return {"seconds": round(wall, 1), "snapshots": n, "cpu_s": round(cpu, 3),
            "core_share": round(cpu / wall, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="lab5")
    ap.add_argument("--index", type=int, default=5)
    ap.add_argument("--crashes", type=int, default=5)
    ap.add_argument("--ready", type=int, default=1, help="ready starts (0: crashes only)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "verify" / "probes.json"))
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for fault in [None] * args.ready + ["kill9"] * args.crashes:
        rows.append(one_start(args.host, args.index, fault))
        # partial results survive an interrupted run
        Path(args.out).write_text(json.dumps({"partial": True, "starts": rows}, indent=2))
    crash = [r for r in rows if r["fault"] == "kill9"]
    summary = {name: {"crash_to_verdict_s_median": statistics.median(
        r[name]["seconds"] for r in crash), "causes": [r[name]["cause"] for r in crash]}
        for name in ("vigil stream", "vigil poll")} if crash else {}
    steady = steady_cost(args.host, args.index)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": args.host,
              "starts": rows, "crash_summary": summary, "stream_steady_cost": steady}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
