"""Stall windows learned from history, live: three good cold starts of the real vLLM CPU
build on a lab host, then a fourth whose worker is SIGSTOPped mid-compile is called
`stalled` within 90 s by the window those starts taught (3x their longest quiet
stretch, floor 60 s), where the default compile window is 8 minutes. No `--stall`
override anywhere. (The same fault with no history, caught at the default window, is
replayed from a real SIGSTOP trace in test_stall_learning.py: 8 minutes of waiting.)

Uses lab5 like test_verify_live.py, one start at a time; the host's own history is put
aside for the test (so only these starts teach) and restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import hosts as lab
from tests.test_verify_live import (
    POLL_S,
    STOP,
    FreezeWorkerInCompile,
    run_verify,
    sh,
    start,
    target,
)
from vigil.deploy import apply as deploy_mod
from vigil.report import Log
from vigil.verify import history, html
from vigil.verify.watch import Settings

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

HISTORY = history.host_path("vllm")


@pytest.fixture(scope="module")
def fresh_history(lab_hosts: object, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[Path]:
    lab.up(5)
    res = deploy_mod.deploy_host(target(), deploy_mod.Options(wait=False), Log())
    assert res.status != "failed", res.error
    sh(f"{STOP}; if [ -e {HISTORY} ]; then mv {HISTORY} {HISTORY}.aside; fi")
    try:
        yield tmp_path_factory.mktemp("stall-learning-state")
    finally:
        sh(f"touch /tmp/vigil-nothrottle; {STOP}; "
           f"if [ -e {HISTORY}.aside ]; then cat {HISTORY} >> {HISTORY}.aside 2>/dev/null; "
           f"mv {HISTORY}.aside {HISTORY}; fi")


def test_three_good_starts_teach_a_window_that_catches_a_frozen_compile(
    fresh_history: Path,
) -> None:
    state = fresh_history
    for i in range(3):
        start(clear_cache=True)
        good = run_verify(state, Settings(poll_s=POLL_S))
        assert good.state is not None and good.state.verdict == "ready", good.state
        assert good.record is not None and good.record.key.cache == "cold"
        quiet = good.state.quiet_s.get("compiling")
        print(f"good start {i + 1}: compiling quiet {quiet} s")

    start(clear_cache=True)
    freeze_worker = FreezeWorkerInCompile()
    stopped, stopped_pid = freeze_worker.at, freeze_worker.pid

    try:
        out = run_verify(state, Settings(poll_s=POLL_S), on_poll=freeze_worker)
    finally:
        sh(f"kill -CONT {' '.join(str(p) for p in stopped_pid)} 2>/dev/null; {STOP}")
    assert out.plan is not None and out.plan.level == "exact" and out.plan.n_samples >= 3
    b = out.plan.budgets
    why = b.stall_why["compiling"]
    print(f"compiling stall window {b.stall('compiling')} s: {why}")
    assert why.startswith("learned: 3x ") and b.stall("compiling") < 480.0
    st = out.state
    assert stopped, "the worker was never seen compiling"
    assert st is not None
    assert (st.verdict, st.cause) == ("stalled", "stalled_compiling"), st.proof
    assert st.now is not None
    print(f"stalled {st.now - stopped[0]:.1f} s after the SIGSTOP")
    assert st.now - stopped[0] <= 90.0
    # the picture of this start (verify --html) shows the verdict and the learned window
    page = html.outcomes_page([out])
    assert ">stalled (stalled_compiling)</div>" in page and "learned: 3x " in page
    (state / "stalled.html").write_text(page)
