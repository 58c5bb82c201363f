"""A picture of a start: one self-contained HTML page (inline SVG and CSS, no scripts,
no external assets) from recorded snapshots and outcomes. Pure: values in, text out.

``start_page``: per host, the phases of the start as a timeline against their budgets and
stall windows, the evidence over time (CPU/wall, compile-cache files, GPU memory, log
lines) and the verdict with its proof line. ``history_page``: phase durations over past
starts, cold vs warm. Every text that came from a host (log lines, proof, names) is
escaped: a log line is data, never markup.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vigil.report import safe_text, write_text
from vigil.verify import catalog, compile_cache, reducer
from vigil.verify.budgets import Budgets, HistoryRecord
from vigil.verify.reducer import Verdict
from vigil.verify.snapshot import Smoke, Snapshot
from vigil.verify.watch import Outcome

WIDTH = 900  # plot width in px, after the label column
LABEL_W = 150
ROW_H = 22
CHART_H = 90
# One colour per phase, in PHASES order (ready last).
PALETTE = ("#8da0cb", "#66c2a5", "#fc8d62", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494",
           "#b3b3b3", "#1b9e77", "#d95f02")
VERDICT_COLOUR: dict[str, str] = {Verdict.READY: "#1a7f37", Verdict.SLOW: "#9a6700",
                  Verdict.STALLED: "#cf222e", Verdict.CRASHED: "#cf222e",
                  Verdict.TIMED_OUT: "#cf222e", Verdict.STOPPED: "#57606a"}

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:20px;margin:0 0 16px}h2{font-size:17px;margin:28px 0 8px}
h3{font-size:14px;margin:14px 0 4px;color:#57606a}
.verdict{font-size:18px;font-weight:600;padding:8px 12px;border-left:6px solid;
 background:#f6f8fa;margin:8px 0}
code,.proof{font:12px ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
.proof{background:#fff8c5;padding:6px 8px;display:block;margin:4px 0}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 10px;text-align:right;
 border-bottom:1px solid #d0d7de}td:first-child,th:first-child{text-align:left}
.muted{color:#57606a}.err{color:#cf222e}svg{display:block;margin:4px 0}
svg text{font:11px system-ui,sans-serif;fill:#1f2328}
"""


def _e(text: object) -> str:
    # control characters (U+2028, ESC, NUL, a lone surrogate) are shown, not written
    return html.escape(safe_text(str(text)), quote=True)


def _mmss(seconds: float) -> str:
    s = max(round(seconds), 0)
    return f"{s // 60}:{s % 60:02d}"


def _colour(phase: str) -> str:
    phases = reducer.PHASES
    return PALETTE[phases.index(phase) % len(PALETTE)] if phase in phases else "#cccccc"


def _label(phase: str) -> str:
    rec = catalog.PHASE.get(phase)
    return rec.label if rec is not None else phase


@dataclass(frozen=True)
class Start:
    """One host's watched start, as recorded: what the page is drawn from."""

    host: str
    snapshots: Sequence[Snapshot] = ()
    state: reducer.WatchState | None = None
    budgets: Budgets | None = None
    level: str = ""  # where the budgets came from: exact | ... | prior
    n_samples: int = 0
    smoke: Smoke | None = None
    error: str | None = None  # the host was lost or the input was bad
    # the watch's verdict on the compile cache (with history); None: the state's own
    compile_cache: compile_cache.CompileCache | None = None


@dataclass(frozen=True)
class Series:
    name: str
    unit: str
    points: tuple[tuple[float, float], ...]  # (seconds since the start, value)


def evidence_series(snaps: Sequence[Snapshot], t0: float) -> list[Series]:
    """The evidence the reducer folds, as time series: CPU seconds per wall second of the
    service's processes (per PID, so a new worker does not count as a jump), compile-
    cache files, GPU memory and journal lines so far."""
    cpu: list[tuple[float, float]] = []
    cache: list[tuple[float, float]] = []
    gpu: list[tuple[float, float]] = []
    lines: list[tuple[float, float]] = []
    prev: Snapshot | None = None
    n_lines = 0
    for s in snaps:
        t = s.time - t0
        n_lines += len(s.journal.lines)
        lines.append((t, float(n_lines)))
        if s.cache is not None:
            cache.append((t, float(s.cache.files)))
        if s.gpus is not None and s.gpus.devices:
            gpu.append((t, s.gpus.used_mib / 1024))
        if (prev is not None and prev.processes is not None and s.processes is not None
                and s.time > prev.time):
            before = {p.pid: p.cpu_s for p in prev.processes.items}
            used = sum(max(p.cpu_s - before[p.pid], 0.0) for p in s.processes.items
                       if p.pid in before)
            cpu.append((t, used / (s.time - prev.time)))
        prev = s
    out = [Series("CPU / wall", "\u00d7", tuple(cpu)),
           Series("compile-cache files", "files", tuple(cache)),
           Series("GPU memory", "GiB", tuple(gpu)),
           Series("log lines", "lines", tuple(lines))]
    return [s for s in out if s.points]


# -- SVG pieces -------------------------------------------------------------------------


def _x(t: float, span: float) -> float:
    return LABEL_W + WIDTH * min(max(t / span, 0.0), 1.0)


def _ticks(span: float, height: float) -> str:
    step = next((s for s in (10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
                 if span / s <= 10), 7200)
    parts = []
    t = 0.0
    while t <= span:
        x = _x(t, span)
        parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" '
                     f'stroke="#eaeef2"/><text x="{x:.1f}" y="{height + 12}" '
                     f'text-anchor="middle">{_mmss(t)}</text>')
        t += step
    return "".join(parts)


def _timeline(start: Start, t0: float, span: float) -> str:
    """One row per phase: the time it took (solid), its budget (dashed outline from the
    phase's start) and its stall window (text; the longest quiet stretch is in the table)."""
    st = start.state
    spans = st.spans if st is not None else ()
    b = start.budgets or Budgets()
    rows = []
    for i, sp in enumerate(spans):
        y = i * ROW_H
        end = sp.end if sp.end is not None else (st.now if st and st.now else sp.start)
        x0, x1 = _x(sp.start - t0, span), _x(end - t0, span)
        colour = _colour(sp.name)
        row = (f'<text x="0" y="{y + 15}">{_e(sp.name)}</text>'
               f'<rect x="{x0:.1f}" y="{y + 4}" width="{max(x1 - x0, 1.5):.1f}" '
               f'height="{ROW_H - 8}" fill="{colour}"><title>{_e(_label(sp.name))}: '
               f'{_mmss(end - sp.start)}</title></rect>')
        if sp.name != "ready":
            xb = _x(sp.start - t0 + b.budget(sp.name), span)
            learned = "learned" if sp.name in b.learned else "default"
            row += (f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(xb - x0, 1):.1f}" '
                    f'height="{ROW_H - 4}" fill="none" stroke="#57606a" '
                    f'stroke-dasharray="4 3"><title>budget {_mmss(b.budget(sp.name))} '
                    f'({learned})</title></rect>')
            note = (f"{_mmss(end - sp.start)} of {_mmss(b.budget(sp.name))}, "
                    f"stall {_mmss(b.stall(sp.name))}")
            row += f'<text x="{min(x1, xb) + 4:.1f}" y="{y + 15}">{_e(note)}</text>'
        rows.append(row)
    if st is not None and st.verdict is not None and st.now is not None:
        x = _x(st.now - t0, span)
        colour = VERDICT_COLOUR.get(st.verdict, "#57606a")
        rows.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{len(spans) * ROW_H}" '
                    f'stroke="{colour}" stroke-width="2"><title>{_e(st.verdict)}</title>'
                    "</line>")
    h = max(len(spans), 1) * ROW_H
    return (f'<svg width="{LABEL_W + WIDTH + 260}" height="{h + 16}" role="img" '
            f'aria-label="phases of {_e(start.host)}">{_ticks(span, h)}{"".join(rows)}</svg>')


def _bands(start: Start, t0: float, span: float, height: float) -> str:
    st = start.state
    out = []
    for sp in st.spans if st is not None else ():
        end = sp.end if sp.end is not None else (st.now if st and st.now else sp.start)
        x0, x1 = _x(sp.start - t0, span), _x(end - t0, span)
        out.append(f'<rect x="{x0:.1f}" y="0" width="{max(x1 - x0, 0):.1f}" '
                   f'height="{height}" fill="{_colour(sp.name)}" opacity="0.18"/>')
    return "".join(out)


def _chart(s: Series, start: Start, t0: float, span: float) -> str:
    top = max(v for _, v in s.points)
    scale = top if top > 0 else 1.0
    pts = " ".join(f"{_x(t, span):.1f},{CHART_H - CHART_H * v / scale:.1f}"
                   for t, v in s.points)
    last = s.points[-1][1]
    return (f'<svg width="{LABEL_W + WIDTH + 10}" height="{CHART_H + 18}" role="img" '
            f'aria-label="{_e(s.name)}">{_bands(start, t0, span, CHART_H)}'
            f'{_ticks(span, CHART_H)}'
            f'<text x="0" y="14">{_e(s.name)}</text>'
            f'<text x="0" y="30" class="muted">max {top:.4g} {_e(s.unit)}</text>'
            f'<text x="0" y="46" class="muted">last {last:.4g} {_e(s.unit)}</text>'
            f'<polyline points="{pts}" fill="none" stroke="#0969da" stroke-width="1.5"/>'
            "</svg>")


def _phase_table(start: Start) -> str:
    st = start.state
    if st is None or not st.spans:
        return ""
    b = start.budgets or Budgets()
    now = st.now or 0.0
    rows = ["<tr><th>phase</th><th>took</th><th>budget</th><th>stall window</th>"
            "<th>longest quiet</th></tr>"]
    for sp in st.spans:
        if sp.name == "ready":
            continue
        quiet = st.quiet_s.get(sp.name)
        src = "history" if sp.name in b.learned else "default"
        rows.append(f"<tr><td>{_e(_label(sp.name))}</td><td>{_mmss(sp.duration(now))}</td>"
                    f"<td>{_mmss(b.budget(sp.name))} ({src})</td>"
                    f"<td>{_mmss(b.stall(sp.name))} <span class=\"muted\">"
                    f"{_e(b.stall_why.get(sp.name, 'default'))}</span></td>"
                    f"<td>{_mmss(quiet) if quiet is not None else '-'}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _verdict(start: Start) -> str:
    st = start.state
    if start.error is not None:
        return f'<div class="verdict err" style="border-color:#cf222e">error</div>' \
               f'<code class="err">{_e(start.error)}</code>'
    if st is None:
        return '<div class="verdict">no snapshots</div>'
    verdict = st.verdict or f"no verdict (in {st.phase})"
    colour = VERDICT_COLOUR.get(st.verdict or "", "#57606a")
    head = verdict + (f" ({st.cause})" if st.cause else "")
    out = [f'<div class="verdict" style="border-color:{colour}" id="verdict">'
           f"{_e(head)}</div>"]
    if st.proof:
        out.append(f'<span class="muted">proof:</span><span class="proof">{_e(st.proof)}'
                   "</span>")
    if st.remedy:
        out.append(f"<p><b>fix:</b> {_e(st.remedy)}</p>")
    if st.summary:
        out.append(f'<p class="muted">{_e(st.summary)}</p>')
    cc = start.compile_cache or compile_cache.judge(
        st.compile_cache, reducer.phase_durations(st).get("compiling"))
    colour = {"hit": "#1a7f37", "miss": "#cf222e", "partial": "#9a6700"}.get(cc.state,
                                                                          "#57606a")
    out.append(f'<p id="compile-cache"><b style="color:{colour}">{_e(cc.line())}</b>'
               + (f'<br><span class="muted">hash {_e(cc.hash)}</span>' if cc.hash else "")
               + "".join(f'<span class="proof">{_e(line)}</span>' for line in cc.proof[:3])
               + "</p>")
    sm = start.smoke
    if sm is not None:
        out.append(f"<p>smoke completion: {sm.tokens} tokens, TTFT {sm.ttft_s or 0:.2f} s, "
                   f"{sm.tokens_per_s or 0:.1f} tok/s</p>" if sm.ok else
                   f'<p class="err">smoke completion failed: {_e(sm.error or "")}</p>')
    return "".join(out)


def _host_section(start: Start) -> str:
    parts = [f"<h2>{_e(start.host)}</h2>", _verdict(start)]
    snaps = start.snapshots
    st = start.state
    if snaps:
        t0 = st.started_at if st is not None and st.started_at is not None else snaps[0].time
        t0 = min(t0, snaps[0].time)
        end = max(snaps[-1].time, st.now or 0.0) if st is not None else snaps[-1].time
        span = max(end - t0, 1.0)
        if start.budgets is not None:
            parts.append(f'<p class="muted">budgets: {_e(start.level or "default")} '
                         f"({start.n_samples} past starts); {len(snaps)} snapshots over "
                         f"{_mmss(end - t0)}</p>")
        parts.append("<h3>phases against budgets (dashed) and stall windows</h3>")
        parts.append(_timeline(start, t0, span))
        parts.append(_phase_table(start))
        parts.append("<h3>evidence over time</h3>")
        parts += [_chart(s, start, t0, span) for s in evidence_series(snaps, t0)]
    return "<section>" + "".join(parts) + "</section>"


def _page(title: str, body: str) -> str:
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1>{body}</body></html>\n")


def start_page(starts: Sequence[Start], *, title: str = "vigil verify") -> str:
    """The page `invoke verify --html FILE` writes."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(
        max((s.snapshots[-1].time for s in starts if s.snapshots), default=0.0)))
    head = f'<p class="muted">{len(starts)} host(s); last snapshot {stamp}</p>'
    return _page(title, head + "".join(_host_section(s) for s in starts))


# -- history ----------------------------------------------------------------------------


def _scatter(phase: str, records: Sequence[HistoryRecord]) -> str:
    """Duration of one phase over past starts (x: the start's order): circles cold,
    squares warm; hollow when the start did not become ready."""
    pts = [(i, r) for i, r in enumerate(records) if phase in r.phases_s]
    if not pts:
        return ""
    top = max(r.phases_s[phase] for _, r in pts) or 1.0
    n = max(len(records) - 1, 1)
    marks = []
    for i, r in pts:
        x = LABEL_W + WIDTH * i / n
        y = CHART_H - CHART_H * r.phases_s[phase] / top + 6
        colour = "#0969da" if r.key.cache == "cold" else "#d97706"
        fill = colour if r.verdict in (Verdict.READY, Verdict.SLOW) else "none"
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started_at))
        tip = f"<title>{_e(when)} {_e(r.host)} {r.key.cache} {_e(r.verdict)}: " \
              f"{r.phases_s[phase]:.1f} s</title>"
        if r.key.cache == "cold":
            marks.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{fill}" '
                         f'stroke="{colour}">{tip}</circle>')
        else:
            marks.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" '
                         f'fill="{fill}" stroke="{colour}">{tip}</rect>')
    axes = "".join(f'<line x1="{LABEL_W}" y1="{y}" x2="{LABEL_W + WIDTH}" y2="{y}" '
                   f'stroke="#d0d7de"{dash}/>'
                   for y, dash in ((CHART_H + 6, ""), (6, ' stroke-dasharray="2 3"')))
    return (f'<svg width="{LABEL_W + WIDTH + 20}" height="{CHART_H + 14}" role="img" '
            f'aria-label="{_e(phase)} over past starts">{axes}'
            f'<text x="0" y="14">{_e(phase)}</text>'
            f'<text x="0" y="30" class="muted">max {_mmss(top)}</text>'
            f'{"".join(marks)}</svg>')


def history_page(records: Sequence[HistoryRecord], *, title: str = "vigil history") -> str:
    """The page `invoke history --html FILE` writes: per model and hardware, each phase's
    duration over past starts, cold (blue circles) vs warm (orange squares)."""
    if not records:
        return _page(title, "<p>no recorded starts (run <code>invoke verify</code>)</p>")
    groups: dict[tuple[str, str], list[HistoryRecord]] = {}
    for r in sorted(records, key=lambda r: r.started_at):
        groups.setdefault((r.key.model, r.key.hardware), []).append(r)
    body = ['<p class="muted">cold cache: blue circles; warm: orange squares; hollow: '
            "the start did not become ready</p>"]
    for (model, hw), recs in groups.items():
        body.append(f"<h2>{_e(model)} on {_e(hw)}</h2>")
        body += [_scatter(p, recs) for p in reducer.PHASES[:-1]]
        body.append(_history_table(recs))
    return _page(title, "".join(body))


def _history_table(records: Sequence[HistoryRecord]) -> str:
    phases = [p for p in reducer.PHASES[:-1] if any(p in r.phases_s for r in records)]
    head = "".join(f"<th>{_e(catalog.PHASE[p].short)}</th>" for p in phases)
    rows = [f"<tr><th>when (UTC)</th><th>host</th><th>cache</th><th>compile cache</th>"
            f"<th>verdict</th>{head}<th>total</th><th>why</th></tr>"]
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started_at))
        cols = "".join(f"<td>{r.phases_s[p]:.1f}</td>" if p in r.phases_s else "<td>-</td>"
                       for p in phases)
        cc = compile_cache.from_record(r.compile_cache)
        rows.append(f"<tr><td>{when}</td><td>{_e(r.host)}</td><td>{r.key.cache}</td>"
                    f"<td>{_e(compile_cache.summary_cell(r.compile_cache))}</td>"
                    f"<td>{_e(r.verdict)}</td>{cols}<td>{r.total_s:.1f}</td>"
                    f'<td class="muted">{_e(cc.reason if cc is not None else "")}</td></tr>')
    return "<table>" + "".join(rows) + "</table>"



# -- the thin shell: outcomes and their traces in, a file out ---------------------------


def start_of(o: Outcome, snapshots: Sequence[Snapshot]) -> Start:
    plan = o.plan
    return Start(host=o.host, snapshots=tuple(snapshots), state=o.state,
                 budgets=plan.budgets if plan is not None else None,
                 level=plan.level if plan is not None else "",
                 n_samples=plan.n_samples if plan is not None else 0,
                 smoke=o.smoke, error=o.error, compile_cache=o.compile_cache)


def outcomes_page(outcomes: Sequence[Outcome]) -> str:
    """`verify --html`: each outcome with the snapshots of the trace it wrote."""
    starts = []
    for o in outcomes:
        snaps: list[Snapshot] = []
        if o.trace is not None and Path(o.trace).is_file():
            # one snapshot a line, at \n only: JSON keeps U+2028 and U+0085 raw in strings
            text = Path(o.trace).read_text(encoding="utf-8", errors="replace")
            snaps = [Snapshot.from_json(line) for line in text.split("\n") if line.strip()]
        starts.append(start_of(o, snaps))
    return start_page(starts)


def write(path: str, page: str) -> None:
    """Write the page whole or not at all (a half page is worse than none)."""
    write_text(path, page)
