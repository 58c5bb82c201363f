"""What a verify shows: a live view on a terminal, plain lines in a pipeline, JSON, JUnit.

Plain output prints a line when something a reader cares about changes (the phase, the
verdict, a new warning) plus a heartbeat a minute, never one per poll: which signals count
as progress flips nearly every poll (a 1-minute lab start printed 28 lines for it), so it
rides on the lines printed, it does not print them.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from vigil.report import Log, echo, failed_word, safe_text, write_text, xml_document
from vigil.verify import catalog, compile_cache, predict, reducer
from vigil.verify.budgets import Budgets
from vigil.verify.reducer import Verdict
from vigil.verify.snapshot import Snapshot
from vigil.verify.watch import Outcome

HEARTBEAT_S = 60.0

# Colour on a terminal only (the live view): a verdict's, and the words a deploy line
# leads with when a host is lost or failed
STYLE: dict[str, str] = {
    Verdict.READY: "green", Verdict.CRASHED: "bold red", Verdict.STALLED: "bold red",
    Verdict.TIMED_OUT: "bold red", Verdict.STOPPED: "yellow"}
ALARM = r"\b(FAILED|UNREACHABLE|ROLLBACK FAILED|LEFT DRAINED)\b"


class _Above:
    """A text stream whose lines print above the live view (a deploy's Log writes one
    whole line per call), the alarm words in red."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def write(self, text: str) -> int:
        shown = Text(text.rstrip("\n"))
        shown.highlight_regex(ALARM, "bold red")
        self.console.print(shown, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass


def _label(state: reducer.WatchState) -> str:
    return state.verdict if state.verdict in reducer.TERMINAL else state.phase


@dataclass
class _Seen:
    label: str = ""
    verdict: str | None = None
    warnings: int = 0
    printed_at: float = 0.0


class Reporter:
    """Receives every poll of every host (from their threads) and shows it."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None,
                 clock: Any = time.monotonic,
                 emit: Callable[[str, str], None] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.emit = emit  # e.g. deploy's Log: lines go through it instead of the stream
        self.live = self.stream.isatty() if live is None else live
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}
        self._rows: dict[str, tuple[str, str, str, str]] = {}
        self._predictions: dict[str, predict.Prediction] = {}
        self._live: Live | None = None
        self._console: Console | None = None  # a terminal's, kept past the live view

    # -- lifecycle --
    def __enter__(self) -> Reporter:
        if self.live:
            # host text is never markup ([/INST], [link=...]) nor emoji codes
            console = Console(file=self.stream, markup=False, emoji=False, highlight=False)
            self._console = console
            self._live = Live(self._table(), console=console, refresh_per_second=4,
                              transient=False)
            self._live.__enter__()
        return self

    def log(self, width: int) -> Log:
        """Deploy's timestamped, host-tagged lines: above the live view (entered first) on
        a terminal, else on the stream as plain lines."""
        if self._live is not None:
            return Log(_Above(self._live.console), width=width)  # type: ignore[arg-type]
        return Log(self.stream, width=width)

    def show(self, text: str) -> None:
        """A task's closing text (deploy's summary): on a terminal its results in colour
        (failed and unreachable red, changed yellow, ok green), else as echo prints."""
        if self._console is None:
            echo(text, file=self.stream)
            return
        shown = Text(safe_text(text))
        shown.highlight_regex(ALARM + r"|\bfailed\b", "bold red")
        shown.highlight_regex(r"\bchanged\b", "yellow")
        shown.highlight_regex(r"\b(ok|ready|rolled_back)\b", "green")
        self._console.print(shown, soft_wrap=True)  # a table's lines are never re-wrapped

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.transient = not self._rows  # no start watched: no empty table left
            self._live.update(self._table())
            self._live.__exit__(None, None, None)
            self._live = None

    # -- events --
    def note(self, host: str, message: str) -> None:
        with self._lock:
            if self._live is not None:
                self._live.console.print(Text(safe_text(f"{host}: {message}")))
            else:
                self._line(host, message)

    def predicted(self, host: str, prediction: predict.Prediction) -> None:
        """The host's start predicted: each poll after shows what is left of it."""
        with self._lock:
            self._predictions[host] = prediction

    def poll(self, host: str, state: reducer.WatchState, snap: Snapshot,
             budgets: Budgets) -> None:
        with self._lock:
            line = line_for(state)
            eta = eta_for(self._predictions.get(host), state)
            if self._live is not None:
                self._rows[host] = (_label(state), state.verdict or "", eta, line)
                self._live.update(self._table())
                return
            seen = self._seen.setdefault(host, _Seen())
            progress = ", ".join(state.evidence.progress) or "none"
            now = self.clock()
            if (_label(state) != seen.label or state.verdict != seen.verdict
                    or len(state.warnings) > seen.warnings
                    or now - seen.printed_at >= HEARTBEAT_S):
                text = f"{line}  ({eta})" if eta else line
                if state.warnings[seen.warnings:]:
                    text += f" [{state.verdict or 'warning'}: {state.warnings[-1]}]"
                self._line(host, f"{text}  (progress: {progress})")
                seen.label, seen.verdict = _label(state), state.verdict
                seen.warnings, seen.printed_at = len(state.warnings), now

    def _line(self, host: str, message: str) -> None:
        if self.emit is not None:
            self.emit(host, message)
            return
        stamp = time.strftime("%H:%M:%S")
        self.stream.write(safe_text(f"{stamp} {host:<8} {message}") + "\n")
        self.stream.flush()

    def _table(self) -> Table:
        table = Table(expand=True)
        table.add_column("host", no_wrap=True)
        table.add_column("phase", no_wrap=True)
        table.add_column("verdict", no_wrap=True)
        table.add_column("eta", no_wrap=True)
        table.add_column("evidence")
        for host in sorted(self._rows):
            phase, verdict, eta, line = self._rows[host]
            # Text, not str: a cell's str would be parsed as rich markup
            cells = [Text(safe_text(cell)) for cell in (host, phase, verdict,
                                                        eta.removeprefix("eta "), line)]
            cells[2].stylize(STYLE.get(verdict, ""))
            table.add_row(*cells)
        return table


def eta_for(prediction: predict.Prediction | None, state: reducer.WatchState) -> str:
    """`eta ~1m10s (p90 2m05s)`: what is left of a start still going, from the phase it
    is in and how long it has been in it; empty without a prediction or once decided."""
    if prediction is None or state.verdict in reducer.TERMINAL:
        return ""
    now = state.now or 0.0
    in_phase = max(now - state.spans[-1].start, 0.0) if state.spans else 0.0
    p = prediction.given(compile_cache.assess(state.compile_cache).state)
    text = p.eta_text(state.phase, in_phase)
    return f"{text}, from cold starts: the compile cache missed" if text and p is not \
        prediction else text


def line_for(state: reducer.WatchState) -> str:
    """The evidence line, with the verdict in front once there is one."""
    if state.verdict in reducer.TERMINAL:
        head: str = state.verdict or ""
        if state.cause:
            head += f" ({state.cause})"
        return f"{head}: {state.summary}"
    return state.summary or state.phase


# -- JSON ---------------------------------------------------------------------------


def _budgets_json(o: Outcome) -> dict[str, Any] | None:
    if o.plan is None or o.key is None:
        return None
    b = o.plan.budgets
    return {
        "level": o.plan.level,
        "samples": o.plan.n_samples,
        "key": {"hardware": o.key.hardware, "gpu_kind": o.key.gpu_kind, "model": o.key.model,
                "config_hash": o.key.config_hash, "stack": o.key.stack, "cache": o.key.cache},
        "hard_cap_s": round(b.hard_cap_s, 1),
        "phases": {
            p: {"budget_s": round(b.budget(p), 1), "stall_s": round(b.stall(p), 1),
                "source": o.plan.source.get(p, "prior"),
                "stall_why": b.stall_why.get(p, "default")}
            for p in reducer.PHASES[:-1]
        },
    }


def outcome_json(o: Outcome) -> dict[str, Any]:
    rep: dict[str, Any] = dict(reducer.report(o.state)) if o.state is not None else {
        "verdict": None, "cause": None, "proof": None, "remedy": None, "phase": None,
        "phases": [], "evidence": None, "warnings": [], "quiet_s": {}}
    probe = sorted(o.probe_s)
    rep.update({
        "host": o.host,
        "exit_code": o.exit_code,
        "error": o.error,
        "budgets": _budgets_json(o),
        "smoke": o.smoke.model_dump() if o.smoke is not None else None,
        "trace": o.trace,
        "recorded": o.record is not None,
        "observed_start": o.observed_start,
        "polls": o.state.polls if o.state is not None else 0,
        "probe_s": {"n": len(probe), "median": round(statistics.median(probe), 3),
                    "max": round(probe[-1], 3)} if probe else None,
        "round_trips": o.round_trips,
        "seconds": o.seconds,
    })
    if o.compile_cache is not None:  # with the comparison against history
        rep["compile_cache"] = o.compile_cache.to_json()
    rep["prediction"] = prediction_json(o)
    return rep


def _took(o: Outcome) -> float | None:
    """The seconds of a start that became ready (what a prediction is measured on)."""
    st = o.state
    if st is None or st.verdict not in (Verdict.READY, Verdict.SLOW) or st.started_at is None \
            or not o.observed_start:  # already serving: its start was not watched
        return None
    return (st.now or st.started_at) - st.started_at


def prediction_json(o: Outcome) -> dict[str, Any] | None:
    """The prediction's fields, with the real start's seconds and the error in % of it
    (a start that became ready) against the prediction of the cache state it proved
    (``measured_cache``: a warm one that missed is measured against cold history), and
    what was left of it at the verdict."""
    if o.prediction is None:
        return None
    cc = outcome_cache(o)
    p = o.prediction.given(cc.state if cc is not None else "unknown")
    took = _took(o)
    out = {**o.prediction.to_json(), "measured_cache": p.cache,
           "actual_s": round(took, 1) if took is not None else None,
           "error_pct": p.error_pct(took) if took is not None else None}
    if o.state is not None and o.state.verdict not in (Verdict.READY, Verdict.SLOW):
        st = o.state
        in_phase = (st.now or 0.0) - st.spans[-1].start if st.spans else 0.0
        left = p.eta(st.phase, max(in_phase, 0.0))
        out["left_at_verdict"] = left.to_json() if left is not None else None
    return out


def run_json(outcomes: list[Outcome], exit_code: int) -> dict[str, Any]:
    return {"ok": exit_code == 0, "exit_code": exit_code,
            "hosts": {o.host: outcome_json(o) for o in outcomes}}


# -- JUnit --------------------------------------------------------------------------


def junit_xml(outcomes: list[Outcome]) -> str:
    """One test case per host; a non-ready verdict is a failure, a lost host an error."""
    failures = sum(1 for o in outcomes if o.error is None and o.verdict != Verdict.READY)
    errors = sum(1 for o in outcomes if o.error is not None)
    total = sum(o.seconds for o in outcomes)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name="vigil.verify", tests=str(len(outcomes)),
                          failures=str(failures), errors=str(errors), time=f"{total:.2f}")
    for o in outcomes:
        case = ET.SubElement(suite, "testcase", classname="vigil.verify", name=o.host,
                             time=f"{o.seconds:.2f}")
        if o.error is not None:
            el = ET.SubElement(case, "error", message=(o.error.splitlines() or [""])[0],
                               type="error")
            el.text = o.error
        elif o.verdict != Verdict.READY and o.state is not None:
            st = o.state
            msg = f"{st.verdict}: {st.cause or '-'} — {st.remedy or ''}".strip()
            el = ET.SubElement(case, "failure", message=msg, type=st.verdict or "unknown")
            el.text = "\n".join(x for x in (st.proof, st.summary) if x)
        out = ET.SubElement(case, "system-out")
        out.text = line_for(o.state) if o.state is not None else ""
    return xml_document(suites)


def write_junit(path: str, outcomes: list[Outcome]) -> None:
    write_text(path, junit_xml(outcomes))


def outcome_cache(o: Outcome) -> compile_cache.CompileCache | None:
    """The outcome's compile cache: the watch's (compared with history), else the start's
    own evidence alone."""
    if o.compile_cache is not None:
        return o.compile_cache
    if o.state is None:
        return None
    return compile_cache.judge(o.state.compile_cache,
                               reducer.phase_durations(o.state).get("compiling"))


def summary(outcomes: list[Outcome]) -> str:
    width = max([8, *(len(o.host) for o in outcomes)])
    lines = [f"{'HOST':<{width}}  {'VERDICT':<11} {'TIME':>8}  DETAIL"]
    for o in outcomes:
        if o.error is not None or o.state is None:
            verdict = failed_word(o.exit_code, "error")
            detail = (o.error or "").splitlines()[0] if o.error else ""
        else:
            verdict = o.state.verdict or "?"
            detail = o.state.proof or ""
            if o.state.cause:
                detail = f"{o.state.cause}: {detail}"
            if o.state.remedy:
                detail += f"\n{'':<{width + 23}}fix: {o.state.remedy}"
            if o.smoke is not None and o.smoke.ok:
                detail += (f" (TTFT {o.smoke.ttft_s or 0:.2f} s, "
                           f"{o.smoke.tokens_per_s or 0:.1f} tok/s)")
            cc = outcome_cache(o)
            if cc is not None:
                detail += f"\n{'':<{width + 23}}{cc.line()}"
            if o.prediction is not None and o.observed_start:
                took = _took(o)
                p = o.prediction.given(cc.state if cc is not None else "unknown")
                text = p.against(took) if took is not None else \
                    p.line().replace("expect ~", "predicted ~", 1)
                if p is not o.prediction:
                    text = f"the compile cache missed: {text}"
                detail += f"\n{'':<{width + 23}}{text}"
        lines.append(f"{o.host:<{width}}  {verdict:<11} {o.seconds:>7.1f}s  {detail}")
    return "\n".join(lines)


def history_table(records: list[Any]) -> str:
    """`invoke history`: one line per past start."""
    if not records:
        return "no recorded starts (run `invoke verify` or `invoke deploy`)"
    phases = [p for p in reducer.PHASES[:-1]
              if any(p in r.phases_s for r in records)]
    head = f"{'WHEN (UTC)':<17} {'HOST':<8} {'MODEL':<14} {'CACHE':<5} {'COMPILE':<13} " \
        f"{'VERDICT':<10}" + "".join(f"{catalog.PHASE[p].short:>8}" for p in phases) \
        + f"{'TOTAL':>8}  CAUSE"
    lines = [head]
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started_at))
        cols = "".join(f"{r.phases_s[p]:>8.1f}" if p in r.phases_s else f"{'-':>8}"
                       for p in phases)
        cc = compile_cache.from_record(r.compile_cache)
        why = f"  compile cache: {cc.reason}" if cc is not None and cc.reason else ""
        lines.append(f"{when:<17} {r.host:<8} {r.key.model[:14]:<14} {r.key.cache:<5} "
                     f"{compile_cache.summary_cell(r.compile_cache):<13} "
                     f"{r.verdict:<10}{cols}{r.total_s:>8.1f}  {r.cause or ''}{why}")
    return "\n".join(lines)
