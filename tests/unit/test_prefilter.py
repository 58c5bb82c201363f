"""Replay's prefilter (vigil/verify/prefilter.py) changes no verdict: every rule's
wordings pass it, the normaliser it skips would have left those lines as they are, and
every corpus log replays to the same report through both paths, alone and after a day's
healthy start (where the prefilter is at work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import FIXTURES
from vigil.verify import catalog, prefilter, replay

LOGS = sorted(p for d in ("logs", "real-logs", "real-logs-12", "real-logs-13", "real-logs-14",
                          "real-logs-15", "real-logs-16", "real-logs-17", "group-logs",
                          "live-faults")
              for p in (FIXTURES / d).glob("*.log"))
# A healthy start that served (vLLM 0.25.1): its lines to the first request answered.
HEALTHY = FIXTURES / "real-logs-15" / "dgx-spark-gb10-served-then-sigterm-shutdown.log"


def _corpus_lines() -> list[str]:
    seen: dict[str, None] = {}
    for path in LOGS:
        for ln in path.read_text(encoding="utf-8", errors="replace").splitlines():
            seen.setdefault(ln, None)
    return list(seen)


LINES = _corpus_lines()


def test_the_corpus_is_there() -> None:
    assert len(LOGS) > 300 and len(LINES) > 10000


def test_every_rule_has_literals_for_the_pass() -> None:
    # a rule without one makes the pass let every line through: correct, and no faster
    assert prefilter.RULES
    missing = [where for where, found in prefilter.FACTORS.items() if not found]
    assert missing == []


def test_every_rule_table_is_in_the_pass() -> None:
    wheres = {where for where, _ in prefilter.RULES}
    assert {f"cause {c.id}" for c in catalog.CAUSES} <= wheres
    assert {f"wait {w.id}" for w in catalog.WAITS} <= wheres
    assert {f"marker {m.name}" for p in catalog.PHASE_RECORDS for m in p.markers} <= wheres
    assert "classify._STOP_TRIGGER" in wheres and "classify._EXCEPTION" in wheres


def test_a_verbatim_line_is_its_normalised_form() -> None:
    verbatim = [ln for ln in LINES if prefilter.verbatim(ln)]
    assert len(verbatim) > len(LINES) // 3
    assert [ln for ln in verbatim if catalog.normalise(ln) != ln] == []


@pytest.mark.parametrize("line", [
    "\x1b[1;36m(APIServer pid=1)\x1b[0m INFO 11-29 10:01:02 [a.py:1] x",
    "(APIServer pid=1)  INFO 11-29 10:01:02 [a.py:1] x",
    "(VllmWorker TP0 pid=9) INFO 11-29 10:01:02 [a.py:1] x",
    "(APIServer pid=1) (EngineCore pid=2) INFO x",
    "(APIServer pid=1) [1;36m(EngineCore pid=2) INFO x",
    "(APIServer pid=1) 36m(EngineCore pid=2) INFO x",
    "(APIServer pid=1)[0;0m INFO x",
    "  | INFO 11-29 10:01:02 [a.py:1] x",
    "2025-05-15T03:31:20.123456789Z INFO 11-29 10:01:02 [a.py:1] x",
    "[rank0]: Traceback (most recent call last):",
    "web  | INFO 11-29 10:01:02 [a.py:1] x",
    "<b>INFO</b> x",
    "x [repeated 3x across cluster]",
    "100%|##| 1/1\rdone",
])
def test_what_the_normaliser_changes_is_never_verbatim(line: str) -> None:
    assert catalog.normalise(line) != line
    assert not prefilter.verbatim(line)


def test_a_line_that_fails_the_pass_meets_no_rule() -> None:
    failed = [ln for ln in LINES if not prefilter.passes(ln)]
    assert len(failed) > 1000
    for ln in failed:
        m = catalog.classify(catalog.normalise(ln))
        assert m.kind in ("other", "serving"), ln
        assert (m.cause, m.wait, m.marker, m.stop) == (None, None, None, None), ln
        assert m.line.level not in ("ERROR", "CRITICAL"), ln
        assert "Traceback (most recent call last):" not in ln


def _both(path: Path) -> tuple[dict[str, object], dict[str, object]]:
    fast = replay.replay_run(path).report
    slow = replay.replay_run(path, prefilter=False).report
    return fast, slow


@pytest.mark.parametrize("path", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_corpus_log_replays_the_same_through_both_paths(path: Path) -> None:
    fast, slow = _both(path)
    assert fast == slow


@pytest.mark.parametrize("path", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_corpus_log_after_a_healthy_start_replays_the_same(path: Path,
                                                                  tmp_path: Path) -> None:
    # The start served first, so every line of the log comes while the prefilter is at
    # work: its fatal lines revoke ready, its stops are noted, its waits warn, the same.
    start = HEALTHY.read_text(encoding="utf-8").splitlines()
    ready = next(i for i, ln in enumerate(start) if '"POST /v1/chat' in ln)
    log = tmp_path / "day.log"
    log.write_text("\n".join(start[:ready + 20]) + "\n" + path.read_text(
        encoding="utf-8", errors="replace"), encoding="utf-8")
    fast, slow = _both(log)
    assert fast == slow
