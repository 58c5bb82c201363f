"""A day of one vLLM server's log, from a real corpus start: the healthy start of
tests/fixtures/real-logs-15/dgx-spark-gb10-served-then-sigterm-shutdown.log (vLLM 0.25.1,
its lines up to `Application startup complete.`), then its own serving lines (requests,
throughput and spec-decoding stats, JIT warnings) repeated with vLLM's stamps moved on so
that the log covers 24 hours, to N lines in all.

    python bench/replay/genlog.py OUT [--lines 1000000] [--stop]

--stop ends the day with the same log's orderly SIGTERM shutdown. Written streamed.
"""

from __future__ import annotations

import argparse
import calendar
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests/fixtures/real-logs-15/dgx-spark-gb10-served-then-sigterm-shutdown.log"
_STAMP = re.compile(r"(INFO|WARNING|ERROR|DEBUG) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
DAY_S = 86400


def _parts() -> tuple[list[str], list[str], list[str]]:
    lines = SOURCE.read_text(encoding="utf-8").splitlines()
    ready = next(i for i, ln in enumerate(lines) if "Application startup complete." in ln)
    stop = next(i for i, ln in enumerate(lines) if "[shutdown]" in ln)
    return lines[:ready + 1], lines[ready + 1:stop], lines[stop:]


def _restamp(line: str, t: float) -> str:
    g = time.gmtime(t)
    return _STAMP.sub(lambda m: f"{m[1]} {g.tm_mon:02d}-{g.tm_mday:02d} "
                      f"{g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d}", line, count=1)


def generate(out: Path, lines: int, stop: bool = False) -> int:
    start, serving, shutdown = _parts()
    t0 = calendar.timegm((2025, 8, 1, 23, 25, 19, 0, 0, 0))
    tail = shutdown if stop else []
    body = lines - len(start) - len(tail)
    written = 0
    with out.open("w", encoding="utf-8") as fh:
        for ln in start:
            fh.write(ln + "\n")
            written += 1
        for i in range(max(body, 0)):
            t = t0 + 1 + (i * DAY_S) // max(body, 1)
            fh.write(_restamp(serving[i % len(serving)], t) + "\n")
            written += 1
        for ln in tail:
            fh.write(_restamp(ln, t0 + DAY_S + 2) + "\n")
            written += 1
    return written


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--stop", action="store_true")
    a = ap.parse_args()
    n = generate(a.out, a.lines, a.stop)
    print(f"{a.out}: {n} lines, {a.out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
