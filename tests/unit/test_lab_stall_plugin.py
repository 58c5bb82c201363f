"""The lab's stuck-start vLLM plugin (lab/plugins/vigil_lab_stall): its pure parts, its
entry point as importlib.metadata finds it on a plain directory, and the import hook
that wraps a phase's code (on a stand-in runner module: vLLM is not installed here; the
live proof on the real vLLM CPU build is in test_stall_learning_live.py)."""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import stall
from lab.plugins import vigil_lab_stall as plugin
from vigil.errors import ConfigError


@pytest.mark.parametrize(("value", "fault"), [
    ("compiling", plugin.Fault("compiling", "spin")),
    (" Compile ", plugin.Fault("compiling", "spin")),
    ("compile:spin", plugin.Fault("compiling", "spin")),
    ("loading", plugin.Fault("loading_weights", "spin")),
    ("load", plugin.Fault("loading_weights", "spin")),
    ("compiling:slow:120", plugin.Fault("compiling", "slow", 120.0, 5.0)),
    ("loading_weights:slow:30:2.5", plugin.Fault("loading_weights", "slow", 30.0, 2.5)),
    ("compiling:slow:3:10", plugin.Fault("compiling", "slow", 3.0, 3.0)),  # step <= total
])
def test_parse_reads_phase_mode_and_seconds(value: str, fault: plugin.Fault) -> None:
    assert plugin.parse(value) == fault


@pytest.mark.parametrize("value", [None, "", "  "])
def test_parse_unset_is_no_fault(value: str | None) -> None:
    assert plugin.parse(value) is None


@pytest.mark.parametrize(("value", "says"), [
    ("compyle", "unknown phase 'compyle'; known: compile, compiling, load, loading, "
                "loading_weights (fault not armed)"),
    ("kv_cache", "unknown phase 'kv_cache'"),
    ("compiling:hang", "unknown mode 'hang'; known: spin, slow"),
    ("compiling:spin:3", "spin takes no arguments"),
    ("compiling:slow", "slow needs SECONDS"),
    ("compiling:slow:1:2:3", "slow needs SECONDS"),
    ("compiling:slow:0", "SECONDS '0' is not a positive number"),
    ("compiling:slow:-5", "SECONDS '-5' is not a positive number"),
    ("compiling:slow:nan", "SECONDS 'nan' is not a positive number"),
    ("compiling:slow:inf", "SECONDS 'inf' is not a positive number"),
    ("compiling:slow:10:x", "STEP 'x' is not a positive number"),
])
def test_parse_refuses_what_it_cannot_do_naming_the_value(value: str, says: str) -> None:
    with pytest.raises(plugin.FaultError) as err:
        plugin.parse(value)
    assert says in str(err.value) and f"VIGIL_LAB_STALL={value!r}" in str(err.value)


@pytest.fixture
def clean_meta_path() -> Iterator[None]:
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = before


def test_an_unknown_phase_is_one_error_line_and_no_fault(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, clean_meta_path: None,
) -> None:
    monkeypatch.setenv(plugin.ENV, "compyle")
    with caplog.at_level(logging.INFO, logger="vllm"):
        plugin.register()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [("ERROR", "vigil-lab-stall: VIGIL_LAB_STALL='compyle': unknown phase "
                      "'compyle'; known: compile, compiling, load, loading, loading_weights "
                      "(fault not armed)")]
    assert not any(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path)


def test_unset_loads_silently_and_arms_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, clean_meta_path: None,
) -> None:
    monkeypatch.delenv(plugin.ENV, raising=False)
    with caplog.at_level(logging.DEBUG, logger="vllm"):
        plugin.register()
    assert caplog.records == []
    assert not any(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path)


RUNNER_SRC = """
calls = []
class CPUModelRunner:
    def profile_run(self):
        calls.append("profile_run")
        return "compiled"
def get_model(**kw):
    calls.append("get_model")
    return "model"
"""


@pytest.fixture
def fake_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                clean_meta_path: None) -> Iterator[str]:
    """A stand-in for vllm.v1.worker.cpu_model_runner, importable and not yet imported."""
    name = f"fake_cpu_model_runner_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(RUNNER_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugin, "RUNNER", name)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    yield name
    sys.modules.pop(name, None)


def test_the_phase_code_is_wrapped_when_the_runner_is_imported_and_faults_once(
    fake_runner: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv(plugin.ENV, "compiling:slow:0.03:0.01")
    with caplog.at_level(logging.INFO, logger="vllm"):
        plugin.register()
        assert fake_runner not in sys.modules  # not imported early: vLLM's order stands
        runner = __import__(fake_runner)
        r = runner.CPUModelRunner()
        assert r.profile_run() == "compiled" and r.profile_run() == "compiled"
    assert runner.calls == ["profile_run", "profile_run"]
    # the slow compile wrote one cache file per step, once (not at the second call)
    assert sorted(p.name for p in (tmp_path / "cache" / "torch_compile_cache"
                                   / "vigil-lab-slow").iterdir()) == [
        "step-0000", "step-0001", "step-0002"]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "armed in pid" in text and "(CPUModelRunner.profile_run)" in text
    assert "slow compiling for 0.03 s" in text
    assert not any(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path)


def test_a_slow_load_logs_a_line_per_step_before_the_real_load(
    fake_runner: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(plugin.ENV, "load:slow:0.02:0.01")
    runner = __import__(fake_runner)  # already imported: patched at once
    with caplog.at_level(logging.INFO, logger="vllm"):
        plugin.register()
        assert runner.get_model(vllm_config=None) == "model"
    steps = [r.getMessage() for r in caplog.records if ", step " in r.getMessage()]
    assert steps == ["vigil-lab-stall: slow loading_weights, step 1",
                     "vigil-lab-stall: slow loading_weights, step 2"]
    assert runner.calls == ["get_model"]


def test_spin_ends_at_its_cap_or_when_orphaned() -> None:
    ticks = iter(range(10**6))
    assert plugin.spin(cap_s=3.0, clock=lambda: float(next(ticks)),
                       parent=lambda: 7) == (3.0, False)
    parents = iter([7, 7, 1])
    spent, orphaned = plugin.spin(cap_s=1e9, clock=lambda: 0.0, parent=lambda: next(parents))
    assert orphaned and spent == 0.0


def test_slow_steps_cover_the_seconds() -> None:
    assert plugin.slow_steps(plugin.Fault("compiling", "slow", 12.0, 5.0)) == [5.0, 5.0, 2.0]


def test_the_entry_point_is_found_on_a_plain_directory() -> None:
    dists = list(importlib.metadata.distributions(path=[str(stall.PLUGINS)]))
    assert [d.metadata["Name"] for d in dists] == ["vigil-lab-stall"]
    eps = [e for d in dists for e in d.entry_points if e.group == "vllm.general_plugins"]
    assert [(e.name, e.value) for e in eps] == [("vigil_lab_stall",
                                                 "vigil_lab_stall:register")]


def test_arming_a_bad_value_is_refused_before_any_host_is_touched() -> None:
    with pytest.raises(ConfigError) as err:
        stall.arm(999, "compyle")  # lab999 does not exist: never reached
    assert "unknown phase 'compyle'" in str(err.value)


def test_the_dropin_puts_the_plugin_on_pythonpath_and_names_the_fault() -> None:
    assert stall.dropin("compiling") == (
        "[Service]\nEnvironment=PYTHONPATH=/run/vigil-lab/plugins\n"
        "Environment=VIGIL_LAB_STALL=compiling\n")
    assert stall.dropin_path() == "/run/systemd/system/vllm.service.d/vigil-lab-stall.conf"
