"""The streaming probe: one persistent channel per host instead of one round trip per poll.

The host agent's `stream` verb follows the unit's journal and writes one JSON line per
event (new lines, a systemd line about the unit, a process of the service exiting) and
a full snapshot every second. Each line here becomes the same `Snapshot` a poll returns,
so the reducer, the trace and replay do not change.

Pure parts (tested without a host): `parse_line` (one line of the stream),
`Resume.accept` (journal cursors: after a reconnect from the last cursor nothing is
lost, and a record seen twice is dropped), `fallback_reason` (whether a stream that
did not start means polling). `StreamProbe` is the thin shell over a transport.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vigil.errors import HostError, VigilError
from vigil.transport.base import Held, Transport
from vigil.transport.remote import TooDeep, agent_command, agent_stdin, parse_json
from vigil.verify.snapshot import Snapshot

STREAM_V = 1
HELLO_TIMEOUT_S = 30.0  # the agent starts on the host's python: seconds on a loaded host
SILENCE_S = 10.0  # no line for this long (the host writes one per second): channel lost
RECONNECTS = 3  # failed reconnects in a row before the watch falls back to polling


@dataclass(frozen=True)
class Hello:
    v: int
    pid: int  # the stream's process on the host (tests kill it to drop the channel)


@dataclass(frozen=True)
class StreamError:
    error: str
    agent_error: bool = False  # the agent refused the request (not a stream failure)


@dataclass(frozen=True)
class RawSnap:
    """A snapshot as the host sent it: the dict (journal lines carry their cursor `c`)."""

    data: dict[str, Any]


Event = Hello | StreamError | RawSnap


def parse_line(text: str) -> Event:
    """One line of the stream; ValueError naming what is wrong when it is not one."""
    try:
        obj = parse_json(text)  # depth-checked, lone surrogates replaced
    except TooDeep as exc:
        raise ValueError(f"stream line is JSON {exc}") from None
    except ValueError:
        raise ValueError(f"stream line is not JSON: {text[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"stream line is {type(obj).__name__}, not an object")
    if "agent_error" in obj:  # a verb the agent does not know, or a malformed request
        return StreamError(str(obj["agent_error"]), agent_error=True)
    kind = obj.get("k")
    if kind == "hello":
        v, pid = obj.get("v"), obj.get("pid")
        if not isinstance(v, int) or not isinstance(pid, int):
            raise ValueError(f"stream hello without v/pid: {text[:120]!r}")
        return Hello(v, pid)
    if kind == "error":
        return StreamError(str(obj.get("error")))
    if kind == "snap" and isinstance(obj.get("snap"), dict):
        return RawSnap(obj["snap"])
    raise ValueError(f"unknown stream line kind {kind!r}")


def cursor_seq(cursor: str) -> tuple[str, int] | None:
    """journald cursor -> (seqnum id, seqnum): `s=<id>;i=<hex>;…`. Within one seqnum id
    the numbers only grow, so they order records; None when the cursor has neither."""
    fields = dict(part.split("=", 1) for part in cursor.split(";") if "=" in part)
    try:
        return fields["s"], int(fields["i"], 16)
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Resume:
    """Where the watcher is in the journal: the last record it accepted."""

    cursor: str | None = None
    seq: tuple[str, int] | None = None

    def fresh(self, c: object) -> bool:
        """Whether a line of the record with cursor `c` is new (not already accepted)."""
        if not isinstance(c, str) or self.seq is None:
            return True
        seq = cursor_seq(c)
        if seq is None or seq[0] != self.seq[0]:
            return c != self.cursor
        return seq[1] > self.seq[1]

    def accept(self, data: dict[str, Any]) -> tuple[dict[str, Any], Resume]:
        """Drop the snapshot's lines of records already accepted; move past the rest."""
        journal = data.get("journal")
        if not isinstance(journal, dict):
            return data, self
        kept: list[Any] = []
        cursor, seq = self.cursor, self.seq
        for line in journal.get("lines") or []:
            c = line.get("c") if isinstance(line, dict) else None
            if not self.fresh(c):
                continue
            kept.append(line)
            if isinstance(c, str) and c != cursor:
                cursor, seq = c, cursor_seq(c) or seq
        end = journal.get("cursor")
        if isinstance(end, str) and Resume(cursor, seq).fresh(end):
            # records without a line of their own (filtered, empty) move the cursor too
            cursor, seq = end, cursor_seq(end) or seq
        out = dict(data, journal=dict(journal, lines=kept, cursor=cursor))
        return out, Resume(cursor, seq)


def fallback_reason(first: Event | None, exit_status: int | None) -> str | None:
    """Why this stream cannot serve the watch (then it polls), or None when it started.

    `first` is the stream's first line (None: nothing came before the channel closed or
    the hello timeout); `exit_status` the channel's, when it ended."""
    if isinstance(first, Hello):
        if first.v != STREAM_V:
            return f"the host's stream speaks v{first.v}, vigil v{STREAM_V}"
        return None
    if isinstance(first, StreamError):
        return f"the host agent refused the stream: {first.error}" if first.agent_error \
            else f"the stream failed on the host: {first.error}"
    if isinstance(first, RawSnap):
        return "the stream sent a snapshot before its hello"
    if exit_status is not None:
        return f"the stream ended before it started (exit {exit_status})"
    return f"no answer from the stream within {HELLO_TIMEOUT_S:g} s"


# -- the shell: one held channel, reconnecting --------------------------------------------


@dataclass
class StreamProbe:
    """A ProbeFn (cursor in, next snapshot out) reading a held stream channel.

    The first call opens the channel from the cursor the watch passes (the first poll's);
    a dropped channel is reopened from the last accepted cursor. When the stream cannot
    start, or keeps failing to reopen, each call polls instead (`fallback`), said once
    through `note`."""

    transport: Transport
    as_root: Callable[[str], str]
    request: dict[str, Any]
    python: str | None
    poll: Callable[[str | None], Snapshot]
    poll_s: float
    note: Callable[[str], None] = lambda _m: None
    sleep: Callable[[float], None] = time.sleep
    interval_s: float = 1.0
    held: Held | None = None
    hello: Hello | None = None
    resume: Resume = field(default_factory=Resume)
    fallback: str | None = None
    reconnects: int = 0
    pids: list[int] = field(default_factory=list)  # every stream process seen on the host

    def _open(self, cursor: str | None) -> str | None:
        """Open the channel; the reason it did not start, or None."""
        self.close()
        req = dict(self.request, cursor=cursor, interval_s=self.interval_s)
        try:
            held = self.transport.hold(self.as_root(agent_command("stream", self.python)))
            held.send(agent_stdin(json.dumps(req) + "\n"))
        except VigilError as exc:
            return f"the stream could not open: {exc.message}"
        first: Event | None = None
        exit_status: int | None = None
        line = held.readline(HELLO_TIMEOUT_S)
        if line:
            try:
                first = parse_line(line)
            except ValueError as exc:
                held.release()
                return f"the stream's first line was not vigil's: {exc}"
        elif line == "":
            exit_status = -1
        why = fallback_reason(first, exit_status)
        if why is not None:
            held.release()
            return why
        assert isinstance(first, Hello)
        self.held, self.hello = held, first
        self.pids.append(first.pid)
        return None

    def _fall_back(self, why: str) -> None:
        self.fallback = why
        self.note(f"streaming unavailable ({why}): polling every {self.poll_s:g} s")

    def __call__(self, cursor: str | None) -> Snapshot:
        if self.fallback is not None:
            # polling now: the watch's cursor is the last poll's, newer than the last
            # record the stream accepted (polling from that one re-read every line since
            # the drop at every poll, and the repeats looked like progress: never stalled)
            self.sleep(self.poll_s)
            return self.poll(cursor or self.resume.cursor)
        if self.resume.cursor is None and cursor is not None:
            self.resume = Resume(cursor, cursor_seq(cursor))
        while True:
            if self.held is None:
                why = self._open(self.resume.cursor)
                if why is not None:
                    if self.hello is None:  # it never started: this host does not stream
                        self._fall_back(why)
                        return self.poll(cursor)
                    if not self._retry(why):
                        return self.poll(self.resume.cursor or cursor)
                    continue
            assert self.held is not None
            line = self.held.readline(SILENCE_S)
            try:
                event = parse_line(line) if line else None
            except ValueError as exc:  # the watch counts it as a failed probe
                raise HostError(self.transport.name, str(exc)) from None
            if event is None or isinstance(event, StreamError):
                why = (f"no line for {SILENCE_S:g} s" if line is None else
                       "the channel closed" if event is None else event.error)
                if not self._retry(why):
                    return self.poll(self.resume.cursor or cursor)
                continue
            if isinstance(event, RawSnap):
                data, self.resume = self.resume.accept(event.data)
                self.reconnects = 0
                return Snapshot.from_reply(self.transport.name, data)

    def _retry(self, why: str) -> bool:
        """The channel dropped: close it, so the next read reopens it from the last
        accepted cursor; False (and polling from now on) once reopening keeps failing."""
        self.close()
        self.reconnects += 1
        if self.reconnects > RECONNECTS:
            self._fall_back(f"{RECONNECTS} reconnects failed, last: {why}")
            return False
        if self.reconnects > 1:
            self.sleep(min(self.poll_s, 2.0))
        return True

    def close(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            held.release()
