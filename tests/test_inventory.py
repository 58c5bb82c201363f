"""Inventory loading, merging and validation: one clear error per bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vigil.desired import inventory
from vigil.desired.targets import parse_sets, resolve
from vigil.errors import ConfigError, RefusedError

REPO_INV = Path(__file__).resolve().parent.parent / "inventory"


@pytest.fixture
def inv_dir(tmp_path: Path) -> Path:
    """A copy of the shipped inventory, without any lab fragment."""
    target = tmp_path / "inventory"
    shutil.copytree(REPO_INV, target, ignore=shutil.ignore_patterns("hosts.d"))
    return target


def test_shipped_inventory_and_every_profile_load() -> None:
    inv = inventory.load(REPO_INV)
    assert {"llm-one", "llm-two"} <= set(inv.select("all"))
    names = inv.names("models")
    assert {"kimi-k2.5-nvfp4", "glm-5", "qwen3.6-27b", "minimax-m2.5", "tiny-cpu"} <= set(names)
    kimi = inv.profile("kimi-k2.5-nvfp4")
    assert (kimi.tensor_parallel_size, kimi.weights_gib_per_gpu) == (8, 70.8)
    assert inv.profile("glm-5").max_model_len == 200000
    assert inv.profile("qwen3.6-27b").tensor_parallel_size == 4


def test_merge_order_all_group_host_flags(inv_dir: Path) -> None:
    (inv_dir / "host_vars" / "llm-one.yml").write_text("port: 8100\nenv: {B: host}\n")
    (inv_dir / "group_vars" / "blackwell8.yml").write_text(
        (inv_dir / "group_vars" / "blackwell8.yml").read_text() + "port: 8050\nenv: {A: group}\n"
    )
    inv = inventory.load(inv_dir)
    one = inv.host_vars("llm-one")
    two = inv.host_vars("llm-two")
    assert one.port == 8100 and two.port == 8050  # host > group > all (8000)
    # dicts merge key by key: all's HF_HUB_OFFLINE survives group's and host's env
    assert one.env == {"HF_HUB_OFFLINE": "1", "A": "group", "B": "host"}
    assert inv.host_vars("llm-one", {"port": 9000}).port == 9000  # flags win


def test_typo_in_group_vars_names_file_and_key(inv_dir: Path) -> None:
    (inv_dir / "group_vars" / "all.yml").write_text("servce_user: vllm\n")
    with pytest.raises(ConfigError) as err:
        inventory.load(inv_dir)
    text = str(err.value)
    assert "group_vars/all.yml" in text and "'servce_user'" in text
    assert "did you mean 'service_user'" in text


def test_malformed_yaml_names_line(inv_dir: Path) -> None:
    (inv_dir / "hosts.yml").write_text("hosts:\n  a: {address: [x\n")
    with pytest.raises(ConfigError) as err:
        inventory.load(inv_dir)
    assert "hosts.yml" in str(err.value) and "line 3" in str(err.value)
    assert err.value.exit_code == 2


def test_wrong_type_names_key_and_value(inv_dir: Path) -> None:
    (inv_dir / "host_vars" / "llm-one.yml").write_text("port: eighty\n")
    inv = inventory.load(inv_dir)
    with pytest.raises(ConfigError) as err:
        inv.host_vars("llm-one")
    assert "port" in str(err.value) and "'eighty'" in str(err.value)


def test_unknown_profile_lists_known_ones(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir)
    with pytest.raises(ConfigError) as err:
        resolve(inv, "llm-one", model="kimi-k3", operator_env={"HF_TOKEN": "x"})
    assert "kimi-k3" in str(err.value) and "kimi-k2.5-nvfp4, minimax-m2.5" in str(err.value)


def test_unknown_host_or_group(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir)
    with pytest.raises(ConfigError, match="no host or group named 'llm-three'"):
        inv.select("llm-one,llm-three")
    assert inv.select("blackwell8,llm-one") == ["llm-one", "llm-two"]


def test_tp_times_pp_larger_than_gpus_is_refused(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir)
    with pytest.raises(RefusedError) as err:
        resolve(inv, "llm-one", model="qwen3.6-27b",
                sets=["tensor_parallel_size=4", "pipeline_parallel_size=4"],
                operator_env={"HF_TOKEN": "x"})
    assert "= 16 GPUs; the host has 8" in str(err.value)


def test_max_model_len_above_model_limit_is_refused(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir)
    with pytest.raises(ConfigError, match="above the model's max_position_embeddings 202752"):
        resolve(inv, "llm-one", model="glm-5", sets=["max_model_len=300000"],
                operator_env={"HF_TOKEN": "x"})


def test_tp_must_divide_heads(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir)
    with pytest.raises(ConfigError, match="does not divide the model's 48 attention heads"):
        inv.profile("minimax-m2.5", {"tensor_parallel_size": 5})


def test_set_flags_route_and_reject_unknown() -> None:
    host, profile = parse_sets(["port=9001", "max_model_len=512", "enforce_eager=true"])
    assert host == {"port": 9001}
    assert profile == {"max_model_len": 512, "enforce_eager": True}
    with pytest.raises(ConfigError, match="not a host variable or model profile field"):
        parse_sets(["max_modle_len=5"])
    with pytest.raises(ConfigError, match="not key=value"):
        parse_sets(["max_model_len"])


def test_missing_secret_is_an_error_that_names_it(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir)
    with pytest.raises(ConfigError, match="needs HF_TOKEN"):
        resolve(inv, "llm-one", model="glm-5", operator_env={})


def test_group_vars_for_undeclared_group(inv_dir: Path) -> None:
    (inv_dir / "group_vars" / "h100.yml").write_text("port: 1\n")
    with pytest.raises(ConfigError, match="unknown group 'h100'"):
        inventory.load(inv_dir)


def test_profile_rejects_positional_extra_args(inv_dir: Path) -> None:
    path = inv_dir / "models" / "glm-5.yml"
    path.write_text(path.read_text().replace("  - --enable-auto-tool-choice",
                                             "  - ; rm -rf /"))
    with pytest.raises(ConfigError, match="one '--flag' or '--flag=value' item"):
        inventory.load(inv_dir).profile("glm-5")


def test_profile_with_old_model_key_names_path(inv_dir: Path) -> None:
    prof = inv_dir / "models" / "glm-5.yml"
    prof.write_text(prof.read_text().replace("path: /srv/models/glm-5-nvfp4",
                                             "model: /srv/models/glm-5-nvfp4"))
    inv = inventory.load(inv_dir)
    with pytest.raises(ConfigError) as err:
        inv.profile("glm-5")
    text = str(err.value)
    assert "models/glm-5.yml" in text and "renamed to 'path'" in text
    assert "path: /srv/models/glm-5-nvfp4" in text


def test_set_path_changes_the_model_directory(inv_dir: Path) -> None:
    assert parse_sets(["path=/srv/models/x"]) == ({}, {"path": "/srv/models/x"})
    inv = inventory.load(inv_dir)
    (t,) = resolve(inv, "llm-one", model="glm-5", sets=["path=/srv/models/x"],
                   operator_env={"HF_TOKEN": "x"})
    assert t.profile.path == "/srv/models/x"
    assert '"--model=/srv/models/x"' in t.rendered.unit_text
    # `model` stays the host variable (a profile name), not the path
    (t,) = resolve(inv, "llm-one", sets=["model=glm-5"], operator_env={"HF_TOKEN": "x"})
    assert t.profile.name == "glm-5" and t.profile.path == "/srv/models/glm-5-nvfp4"
