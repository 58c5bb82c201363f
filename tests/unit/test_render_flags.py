"""Every profile field that becomes a server flag, each exactly as vLLM spells it, and the
render helpers whose output names a directory or hides a secret (killing the mutants
`mutmut` found alive: bench/mutation/RESULTS.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.paths import REPO
from vigil.desired import inventory
from vigil.desired.config import HostVars, ModelProfile
from vigil.desired.render import (
    API_SERVER,
    TEMPLATES,
    Rendered,
    env_quote,
    is_secret,
    paths_for,
    render,
    stack_hash,
    vllm_argv,
)
from vigil.desired.stacks import Stack
from vigil.errors import ConfigError, TemplateError

REPO_INV = REPO / "inventory"


def _host(**extra: object) -> HostVars:
    return HostVars.model_validate({"address": "h.invalid", **extra})


def _profile(**fields: object) -> ModelProfile:
    return ModelProfile.model_validate({"name": "p", "path": "/srv/models/p",
                                        "max_model_len": 4096, "weights_gib_per_gpu": 1.0,
                                        **fields})


def test_defaults_render_only_the_flags_every_start_needs() -> None:
    argv = vllm_argv("/py", _host(), _profile())
    assert argv == ["/py", "-m", API_SERVER, "--model=/srv/models/p", "--host=0.0.0.0",
                    "--port=8000", "--tensor-parallel-size=1", "--pipeline-parallel-size=1",
                    "--max-model-len=4096", "--gpu-memory-utilization=0.92",
                    "--disable-access-log-for-endpoints=/health,/metrics"], argv


def test_every_optional_field_renders_its_flag() -> None:
    argv = vllm_argv("/py", _host(), _profile(
        data_parallel_size=2, dtype="float16", quantization="fp8", kv_cache_dtype="fp8",
        max_num_seqs=64, enforce_eager=True, trust_remote_code=True, shutdown_timeout_s=30,
        extra_args=["--seed=1"]))
    assert argv[8:] == ["--data-parallel-size=2", "--max-model-len=4096",
                        "--gpu-memory-utilization=0.92", "--dtype=float16",
                        "--quantization=fp8", "--kv-cache-dtype=fp8", "--max-num-seqs=64",
                        "--enforce-eager", "--trust-remote-code", "--shutdown-timeout=30",
                        "--disable-access-log-for-endpoints=/health,/metrics", "--seed=1"], argv


def test_stack_hash_is_the_stacks_content_without_its_description() -> None:
    st = inventory.load(REPO_INV).stack("lab-cpu")
    h = stack_hash(st)
    assert len(h) == 12 and int(h, 16) >= 0
    described = Stack.model_validate({**st.model_dump(), "description": "other words"})
    assert stack_hash(described) == h
    pins = dict(st.packages)
    name = next(iter(pins))
    bumped = Stack.model_validate({**st.model_dump(), "packages": {**pins, name: "0.0.1"}})
    assert stack_hash(bumped) != h
    reordered = Stack.model_validate({**st.model_dump(),
                                      "packages": dict(reversed(list(pins.items())))})
    assert stack_hash(reordered) == h


def test_paths_of_a_release() -> None:
    st = inventory.load(REPO_INV).stack("lab-cpu")
    p = paths_for(_host(service="svc", env_root="/e"), st)
    assert (p.unit, p.env, p.current, p.python) == (
        "/etc/systemd/system/svc.service", "/etc/vigil/svc.env", "/e/current",
        "/e/current/bin/python")
    assert p.env_dir == f"/e/lab-cpu-{stack_hash(st)}"
    assert (p.backup_dir, p.state, p.cache, p.lock) == (
        "/var/lib/vigil/backup/svc", "/var/lib/vigil/svc", "/var/cache/vigil/svc",
        "/var/lib/vigil/svc.lock")


def test_secret_names_declared_or_by_their_shape() -> None:
    assert is_secret("MY_ODD_NAME", frozenset({"MY_ODD_NAME"}))  # declared only
    assert is_secret("OPENAI_API_KEY")  # by shape only
    assert not is_secret("HF_HUB_OFFLINE", frozenset({"HF_TOKEN"}))


def test_env_quote_escapes_what_systemd_would_expand() -> None:
    assert env_quote("it's $HOME `x` \\ \"q\"") == '"it\'s \\$HOME \\`x\\` \\\\ \\"q\\""'
    assert env_quote("XX") == "'XX'"
    assert env_quote("it's XX") == '"it\'s XX"'  # only those four are escaped


# -- render() as a whole: the values it derives and its one clear errors ----------------

def _render(host: HostVars, profile: ModelProfile, env: dict[str, str] | None = None,
            template_dir: Path = TEMPLATES) -> Rendered:
    st = inventory.load(REPO_INV).stack("lab-cpu")
    return render("h", host, profile, st, env or {}, template_dir)


def test_percent_in_the_description_is_escaped_for_systemd() -> None:
    r = _render(_host(), _profile(served_model_name="a%b"))
    assert "Description=vLLM a%%b on port 8000 (vigil)" in r.unit_text


def test_systemd_waits_for_a_drain_longer_than_its_own_stop_timeout() -> None:
    r = _render(_host(timeout_stop_s=90), _profile(shutdown_timeout_s=120))
    assert "TimeoutStopSec=150\n" in r.unit_text


def test_a_declared_secret_is_masked_whatever_its_name() -> None:
    r = _render(_host(secret_env=["ODD_NAME"]), _profile(), {"ODD_NAME": "v4lue"})
    assert "ODD_NAME='v4lue'" in r.env_text
    assert "v4lue" not in r.env_masked and "ODD_NAME='***'" in r.env_masked


def test_a_missing_secret_names_itself_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        _render(_host(secret_env=["HF_TOKEN"]), _profile())
    assert str(err.value) == ("secret_env: secret_env of host h needs HF_TOKEN, not set in "
                              "your environment\n  fix: export HF_TOKEN=... before running, "
                              "or remove it from secret_env")


def test_every_missing_secret_is_named_and_review_renders_them_empty() -> None:
    host = _host(secret_env=["HF_TOKEN", "WANDB_API_KEY"])
    with pytest.raises(ConfigError, match="needs HF_TOKEN, WANDB_API_KEY, not set"):
        _render(host, _profile())
    st = inventory.load(REPO_INV).stack("lab-cpu")
    review = render("h", host, _profile(), st, {}, require_secrets=False)
    assert review.env["HF_TOKEN"] == "" and review.env["WANDB_API_KEY"] == ""
    assert "HF_TOKEN=''" in review.env_text


def test_a_control_character_in_a_value_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^TOK: value of TOK contains a control character$"):
        _render(_host(secret_env=["TOK"]), _profile(), {"TOK": "a\x1bb"})


def test_template_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(TemplateError) as missing:
        _render(_host(), _profile(), template_dir=tmp_path)
    assert str(missing.value) == (f"{tmp_path}/vllm.service.j2: template not found\n"
                                  "  fix: restore it from the repository")
    shutil.copytree(TEMPLATES, tmp_path / "t")
    (tmp_path / "t" / "vllm.service.j2").write_text("a\n{{ nope }}\n")
    with pytest.raises(TemplateError) as undefined:
        _render(_host(), _profile(), template_dir=tmp_path / "t")
    assert str(undefined.value) == (f"{tmp_path}/t/vllm.service.j2: line 2: 'nope' is undefined\n"
                                    "  fix: use only variables vigil/desired/render.py passes")
    (tmp_path / "t" / "vllm.service.j2").write_text("a\n{% if %}\n")
    with pytest.raises(TemplateError, match=r"vllm\.service\.j2: line 2: ") as syntax:
        _render(_host(), _profile(), template_dir=tmp_path / "t")
    assert syntax.value.fix is None
