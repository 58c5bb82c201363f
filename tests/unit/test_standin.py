"""The lab stand-in (lab/standin.py) keeps its contract: it replays the recorded start
with the reducer's phases, answers /health only once the recording says it started,
streams completions, crashes or stalls where told, and drains on SIGTERM like vLLM with
--shutdown-timeout. Run as a real process on a free local port."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import fleet
from tests.paths import REPO


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("standin") / "script.json"
    path.write_text(json.dumps(fleet.script_from_trace()))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, script: Path, **env: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "lab" / "standin.py"), f"--port={self.port}",
             "--host=127.0.0.1", "--served-model-name=standin", "--shutdown-timeout=30"],
            env={**os.environ, "STANDIN_SCRIPT": str(script), "STANDIN_SPEED": "0.01",
                 "STANDIN_TOKEN_S": "0.01", **env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, text: str) -> None:
        while not any(text in ln for ln in self.lines):
            assert self.proc.poll() is None or any(text in ln for ln in self.lines), \
                "\n".join(self.lines[-5:])
            time.sleep(0.05)

    def get(self, path: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", path)
        return conn.getresponse().status

    def stream(self, max_tokens: int,
               first: threading.Event | None = None) -> tuple[int, list[str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        body = {"model": "standin", "prompt": "x", "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        conn.request("POST", "/v1/completions", json.dumps(body))
        resp = conn.getresponse()
        events = []
        for raw in resp:
            if raw.decode().startswith("data:"):
                events.append(raw.decode().strip()[5:].strip())
                if first is not None:
                    first.set()
        return resp.status, events


@pytest.fixture
def server(script: Path) -> Iterator[Server]:
    s = Server(script)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def test_replays_the_recorded_start_then_serves(server: Server) -> None:
    server.wait_line("Application startup complete.")
    recorded = [ln["text"] for ln in fleet.script_from_trace()["lines"]]
    assert server.lines[:len(recorded)] == [
        t.replace("0.0.0.0:8000", f"127.0.0.1:{server.port}") for t in recorded]
    assert server.get("/health") == 200
    status, events = server.stream(5)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for c in chunks for ch in c["choices"] if ch["text"]) == 5
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_sigterm_drains_in_flight_and_refuses_new(server: Server) -> None:
    server.wait_line("Application startup complete.")
    result: list[tuple[int, list[str]]] = []
    first = threading.Event()
    th = threading.Thread(target=lambda: result.append(server.stream(300, first)))
    th.start()
    assert first.wait(timeout=30)  # a token is out: the stream is in flight
    server.proc.send_signal(signal.SIGTERM)
    server.wait_line("mode=drain timeout=30s")
    with pytest.raises(OSError):
        server.get("/health")  # the listening socket is closed: refused, not cut
    th.join(timeout=60)
    status, events = result[0]
    assert status == 200 and events[-1] == "[DONE]"
    assert sum(1 for e in events[:-1] for ch in json.loads(e)["choices"] if ch["text"]) == 300
    assert server.proc.wait(timeout=30) == 0
    assert not any("aborting" in ln for ln in server.lines)


@pytest.mark.parametrize("phase", ["loading_weights", "compiling"])
def test_crash_at_a_phase(script: Path, phase: str) -> None:
    s = Server(script, STANDIN_CRASH_AT=phase)
    assert s.proc.wait(timeout=60) == 1
    s.reader.join(timeout=5)
    assert s.lines[-1] == f"stand-in: told to crash at the start of phase {phase}"
    phases = {ln["text"]: ln["phase"] for ln in fleet.script_from_trace()["lines"]}
    order = fleet.script_from_trace()["phases"]
    seen = {phases[ln] for ln in s.lines[:-1] if ln in phases}
    assert phase not in seen and all(order.index(p) < order.index(phase) for p in seen)


def test_stall_at_a_phase_stays_alive_and_silent(script: Path) -> None:
    s = Server(script, STANDIN_STALL_AT="compiling")
    try:
        s.wait_line("told to stall at the start of phase compiling")
        n = len(s.lines)
        assert s.proc.poll() is None
        with pytest.raises(OSError):
            s.get("/health")  # never reached the line that opens the port
        assert len(s.lines) == n
    finally:
        s.proc.kill()
        s.proc.wait()


def test_the_wheel_installs_the_standin_as_the_vllm_entry_point(tmp_path: Path) -> None:
    import zipfile

    wheel = fleet.build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "vllm/entrypoints/openai/api_server.py" in names
        source = (REPO / "lab" / "standin.py").read_bytes()
        assert zf.read("vigil_lab_standin/__init__.py") == source
        record = zf.read("vigil_lab_standin-0.1.0.dist-info/RECORD").decode()
    assert {line.split(",")[0] for line in record.splitlines()} == names
    assert (tmp_path / fleet.DIST / "index.html").read_text().count(fleet.WHEEL) == 2
