"""Drain, for real: completions streamed to a lab host running the real vLLM CPU build
while a rolling deploy restarts it. None may be cut in the middle: each one completes,
or is refused before its first token.

Two clients stream at once: one behaves like a load balancer's upstream and sends only
while the host is "in the pool" (the deploy's --before-stop / --after-ready hooks take it
out and put it back), the other ignores the pool and keeps sending throughout. vLLM's
--shutdown-timeout (the profile's shutdown_timeout_s) lets the requests in flight at the
SIGTERM finish; the test also checks that at least one did straddle the stop.

    flock /tmp/vigil-lab.lock .venv/bin/python -m pytest -q tests/lab/test_drain_lab.py
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from lab import hosts
from tests.paths import REPO

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.drives(1, 2)]

HOST = 1
PORT = hosts.service_port(HOST)
DRAIN_S = 60
MAX_TOKENS = 1000  # a few seconds per stream on the lab's 2 cores

# The load balancer's hook. Before the drain it lets the clients go and waits (at most
# 120 s) until both stream, so the restart happens under load with streams in flight:
# the clients start only here, not while the deploy checks the host (two streams take
# both cores and its checks took 1-2 minutes under them, measured).
HOOK = """
import os, sys, time
if sys.argv[2] == "drain":
    open(sys.argv[1] + ".go", "w").close()
    end = time.time() + 120
    while time.time() < end and not all(
            os.path.exists(sys.argv[1] + ".streaming." + c) for c in ("pooled", "raw")):
        time.sleep(0.1)
with open(sys.argv[1], "w") as fh:
    fh.write(sys.argv[2])
with open(sys.argv[1] + ".log", "a") as fh:
    fh.write("%f %s %s\\n" % (time.time(), sys.argv[2], os.environ["VIGIL_HOST"]))
"""


@dataclass
class Request:
    client: str
    start: float
    end: float = 0.0
    chunks: int = 0
    finish: str | None = None  # the server's finish_reason: it ended the stream itself
    done: bool = False  # [DONE] after it
    error: str = ""

    @property
    def outcome(self) -> str:
        if self.done and self.finish == "length" and not self.error:
            return "complete"
        return "refused" if self.chunks == 0 else "cut"


def stream_once(client: str, on_chunk: Callable[[], None] = lambda: None) -> Request:
    req = Request(client, time.time())
    body = json.dumps({"model": "tiny", "prompt": "The capital of France is",
                       "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                       "stream": True})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            req.error = f"HTTP {resp.status}"
        else:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    req.done = True
                    break
                msg = json.loads(data)
                if msg.get("error"):
                    req.error = str(msg["error"])[:200]
                    break
                req.chunks += 1
                on_chunk()
                for ch in msg.get("choices") or []:
                    req.finish = ch.get("finish_reason") or req.finish
        conn.close()
    except (OSError, http.client.HTTPException) as exc:
        req.error = f"{type(exc).__name__}: {exc}"
    req.end = time.time()
    return req


def journal_of(i: int, since: float) -> tuple[int, str]:
    # Everything since the rolling deploy began (not the last N lines, which a verbose
    # start can push the shutdown out of). Right after a vLLM start the 2 shared cores
    # are busy: an SSH channel may time out.
    for attempt in range(3):
        try:
            code, out, _ = hosts.run(i, f"journalctl -u vllm -o short-unix --no-pager "
                                        f"--since @{int(since)}", timeout=120)
            return code, out
        except (OSError, paramiko.SSHException):
            if attempt == 2:
                raise
            time.sleep(5)
    raise AssertionError("unreachable")


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / ".venv" / "bin" / "invoke"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)


def rolling_restart_under_load(name: str, drain_s: int,
                               tmp_path: Path) -> tuple[list[Request], float, str]:
    """Stream with both clients while a rolling deploy restarts the host; the requests,
    the time vLLM logged its SIGTERM handling, and a printable report."""
    setting = f"shutdown_timeout_s={drain_s}"
    first = invoke("deploy", "--hosts", name, "--set", setting)
    assert first.returncode == 0, first.stdout + first.stderr

    pool = tmp_path / "pool"
    pool.write_text("enable")
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    requests: list[Request] = []
    stop = threading.Event()
    lock = threading.Lock()

    go = pool.with_name(pool.name + ".go")  # see HOOK

    def client(kind: str) -> None:
        streaming = pool.with_name(f"{pool.name}.streaming.{kind}")
        while not stop.is_set():
            if not go.exists() or (kind == "pooled" and pool.read_text() != "enable"):
                time.sleep(0.1)
                continue
            r = stream_once(kind, streaming.touch)
            with lock:
                requests.append(r)
            if r.outcome == "refused":
                time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(k,)) for k in ("pooled", "raw")]
    for th in threads:
        th.start()
    try:
        # both clients streaming before the restart: the before-stop hook sees to it
        rolled_at = time.time() - 5
        roll = invoke("deploy", "--hosts", name, "--set", setting, "--restart",
                      "--serial", "1", "--junit", str(tmp_path / "roll.xml"),
                      "--before-stop", f"{sys.executable} {hook} {pool} drain",
                      "--after-ready", f"{sys.executable} {hook} {pool} enable")
        time.sleep(5)  # and after it
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=180)
    assert roll.returncode == 0, roll.stdout + roll.stderr

    code, journal = journal_of(HOST, rolled_at)
    assert code == 0
    mode = "drain" if drain_s else "abort"
    stops = [float(line.split()[0]) for line in journal.splitlines()
             if f"[shutdown] API server: stopping engine client mode={mode}" in line]
    # what systemd and vLLM said about stopping and starting, should the line be missing
    around = "\n".join(ln for ln in journal.splitlines() if any(w in ln for w in (
        "shutdown", "Stopping", "Stopped", "Started", "Starting", "Suppressed", "SIGTERM",
        "signal", "Main process exited", "vLLM API server version")))
    assert stops, f"vLLM logged no {mode} shutdown since the roll began:\n{around[-4000:]}" \
        f"\n--- roll:\n{roll.stdout[-3000:]}"
    sigterm = stops[-1]
    report = "\n".join(f"{r.client} {r.start - sigterm:+.1f}..{r.end - sigterm:+.1f} s "
                        f"{r.outcome} chunks={r.chunks} {r.error}" for r in requests)
    if os.environ.get("VIGIL_DRAIN_REPORT"):
        with open(os.environ["VIGIL_DRAIN_REPORT"], "a") as fh:
            fh.write(f"== shutdown_timeout_s={drain_s} (times from the SIGTERM)\n{report}\n")
    return requests, sigterm, report


def test_streams_complete_or_are_refused_during_a_rolling_restart(
        lab_hosts: list[hosts.HostStatus], tmp_path: Path) -> None:
    try:
        requests, sigterm, report = rolling_restart_under_load(hosts.host_name(HOST), DRAIN_S,
                                                               tmp_path)
    finally:  # 2 shared cores: leave no vLLM serving behind for the tests after this one
        hosts.run(HOST, hosts.stop_now(), timeout=120)
    outcomes = {(r.client, r.outcome) for r in requests}
    cut = [r for r in requests if r.outcome == "cut"]
    assert not cut, f"streams cut in the middle:\n{report}"
    straddled = [r for r in requests if r.start < sigterm < r.end and r.outcome == "complete"]
    assert straddled, f"no stream was in flight at the SIGTERM:\n{report}"
    assert ("raw", "refused") in outcomes, f"the raw client never found it down:\n{report}"
    pooled_after = [r for r in requests if r.client == "pooled" and r.start > sigterm]
    assert pooled_after and all(r.outcome == "complete" for r in pooled_after), report
