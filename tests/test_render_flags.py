"""Every profile field that becomes a server flag, each exactly as vLLM spells it, and the
render helpers whose output names a directory or hides a secret (killing the mutants
`mutmut` found alive: bench/mutation/RESULTS.md)."""

from __future__ import annotations

from pathlib import Path

from vigil.desired import inventory
from vigil.desired.config import HostVars, ModelProfile, Stack
from vigil.desired.render import API_SERVER, env_quote, is_secret, paths_for, stack_hash, vllm_argv

REPO_INV = Path(__file__).resolve().parent.parent / "inventory"


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
