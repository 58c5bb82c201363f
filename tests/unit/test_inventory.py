"""Inventory loading, merging and validation: one clear error per bad input."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.paths import REPO
from vigil.desired import inventory
from vigil.desired.ansible import expand_range
from vigil.desired.targets import parse_sets, resolve
from vigil.errors import ConfigError, RefusedError

REPO_INV = REPO / "inventory"


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


# -- issue 22: Ansible's layout, formats, precedence and patterns ------------------------

ENV = {"HF_TOKEN": "x"}
INI = """\
# an Ansible user's own inventory, unchanged
bastion ansible_host=10.0.0.1

[gpu]
h100-[01:04] ansible_user=ubuntu ansible_port=2222
bw-01 ansible_host=bw.example ansible_become=yes   # inline comment

[gpu:vars]
model=glm-5
ansible_python_interpreter=/usr/bin/python3

[h200]
h200-[a:b]

[fleet:children]
gpu
h200

[all:vars]
ansible_user=root
"""
ANSIBLE_YAML = """\
all:
  vars:
    ansible_user: root
  hosts:
    bastion: {ansible_host: 10.0.0.1}
  children:
    fleet:
      children:
        gpu:
          hosts:
            h100-[01:04]: {ansible_user: ubuntu, ansible_port: 2222}
            bw-01: {ansible_host: bw.example, ansible_become: true}
          vars:
            model: glm-5
            ansible_python_interpreter: /usr/bin/python3
        h200:
          hosts:
            h200-[a:b]:
"""


def _ansible(tmp_path: Path, hosts_name: str, text: str) -> Path:
    """An Ansible inventory with vigil's profiles and stacks beside it."""
    root = tmp_path / "ansible"
    root.mkdir()
    for part in ("models", "stacks"):
        shutil.copytree(REPO_INV / part, root / part)
    (root / hosts_name).write_text(text)
    (root / "group_vars").mkdir()
    (root / "group_vars" / "all.yml").write_text(
        "secret_env: [HF_TOKEN]\ngpu: {kind: H100, count: 8, memory_gib: 80}\n"
        "stack: vllm-0.16-nightly\n")
    return root


@pytest.mark.parametrize(("hosts_name", "text"), [("hosts.ini", INI), ("hosts", INI),
                                                  ("hosts.yml", ANSIBLE_YAML),
                                                  ("hosts.yaml", ANSIBLE_YAML)])
def test_an_ansible_inventory_is_read_as_it_is(tmp_path: Path, hosts_name: str,
                                               text: str) -> None:
    inv = inventory.load(_ansible(tmp_path, hosts_name, text))
    assert list(inv.hosts) == ["bastion", "h100-01", "h100-02", "h100-03", "h100-04",
                               "bw-01", "h200-a", "h200-b"]
    assert inv.groups["fleet"] == ["h100-01", "h100-02", "h100-03", "h100-04", "bw-01",
                                   "h200-a", "h200-b"]  # a child's hosts are the parent's
    assert inv.groups["ungrouped"] == ["bastion"]
    h100 = inv.host_vars("h100-03")
    assert (h100.ssh_user, h100.ssh_port, h100.model, h100.address) == (
        "ubuntu", 2222, "glm-5", "h100-03")  # no ansible_host: its name (issue 29.1)
    bw = inv.host_vars("bw-01")
    assert (bw.address, bw.sudo, bw.ssh_user, bw.ssh_port) == ("bw.example", True, "root", 22)
    assert inv.host_vars("bastion").address == "10.0.0.1"
    assert inv.ansible
    assert any("ansible_python_interpreter" in w and "does not use" in w
               for w in inv.warnings), inv.warnings
    (t,) = resolve(inv, "h100-01", operator_env=ENV)
    assert t.profile.name == "glm-5" and t.stack.name == "vllm-0.16-nightly"


def test_every_ansible_connection_variable_is_a_vigil_host_key(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\nh1 ansible_ssh_private_key_file=keys/id "
                    "ansible_connection=local ansible_become=False ansible_ssh_user=ops\n")
    hv = inventory.load(root).host_vars("h1")
    assert (hv.ssh_key, hv.connection, hv.sudo, hv.ssh_user) == (
        str(root / "keys/id"), "local", False, "ops")


def test_an_ansible_name_and_its_vigil_key_together_are_one_error(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\nh1 ansible_user=a ssh_user=b\n")
    with pytest.raises(ConfigError, match="both ansible_user and ssh_user are given") as err:
        inventory.load(root)
    assert "hosts.ini: host h1" in str(err.value)


def test_ansible_connection_vigil_does_not_speak_is_refused(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\nh1 ansible_connection=winrm\n")
    with pytest.raises(ConfigError, match="ansible_connection 'winrm'"):
        inventory.load(root)


def test_a_playbook_variable_is_a_warning_and_a_near_miss_of_a_vigil_key_an_error(
        tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\nh1 nvidia_driver=550\n")
    inv = inventory.load(root)
    assert any("'nvidia_driver'" in w and "not a vigil variable" in w for w in inv.warnings)
    assert inv.host_vars("h1").port == 8000  # the variable is set aside, not a crash
    (root / "hosts.ini").write_text("[gpu]\nh1 servce_user=x\n")
    with pytest.raises(ConfigError, match="did you mean 'service_user'"):
        inventory.load(root)
    (root / "hosts.ini").write_text("[gpu]\nh1 ansible_hots=x\n")
    with pytest.raises(ConfigError, match="did you mean 'ansible_host'"):
        inventory.load(root)


def test_vigils_own_format_still_refuses_a_foreign_key(inv_dir: Path) -> None:
    (inv_dir / "host_vars" / "llm-one.yml").write_text("nvidia_driver: 550\n")
    with pytest.raises(ConfigError, match="unknown key 'nvidia_driver'"):
        inventory.load(inv_dir)


def test_vigils_own_hosts_file_takes_host_ranges_too(inv_dir: Path) -> None:
    (inv_dir / "hosts.yml").write_text(
        "hosts:\n  llm-one: {}\n  llm-two: {}\n  h100-[1:3]: {address: 10.0.0.9}\n"
        "groups:\n  blackwell8: {hosts: [llm-one, llm-two]}\n  h100: {hosts: ['h100-[1:3]']}\n")
    inv = inventory.load(inv_dir)
    assert inv.select("h100") == ["h100-1", "h100-2", "h100-3"]
    assert inv.host_vars("h100-2").address == "10.0.0.9"


@pytest.mark.parametrize(("pattern", "names"), [
    ("h100-[01:03]", ["h100-01", "h100-02", "h100-03"]),
    ("h[08:10]x", ["h08x", "h09x", "h10x"]),
    ("n[1:3]", ["n1", "n2", "n3"]),
    ("r[a:c]", ["ra", "rb", "rc"]),
    ("h[0:6:3]", ["h0", "h3", "h6"]),
    ("h[:2]", ["h0", "h1", "h2"]),
    ("r[1:2]-g[a:b]", ["r1-ga", "r1-gb", "r2-ga", "r2-gb"]),
    ("plain", ["plain"]),
])
def test_host_ranges_expand_as_ansibles(pattern: str, names: list[str]) -> None:
    assert expand_range(pattern) == names


@pytest.mark.parametrize(("pattern", "why"), [
    ("h[01:100]", "one width"), ("h[5:1]", "begins after it ends"), ("h[1:]", "no end"),
    ("h[1:3:0]", "step"), ("h[1-3]", "not a range"), ("h[1:3", "without its pair"),
    ("h[aa:bb]", "not a range of numbers"), ("h[0:99999]", "more than 10000"),
])
def test_a_bad_host_range_is_one_error_naming_file_and_pattern(
        tmp_path: Path, pattern: str, why: str) -> None:
    root = _ansible(tmp_path, "hosts.ini", f"[gpu]\n{pattern}\n")
    with pytest.raises(ConfigError) as err:
        inventory.load(root)
    text = str(err.value)
    assert "hosts.ini" in text and repr(pattern) in text and why in text, text
    assert err.value.exit_code == 2


def test_ansible_yaml_with_unknown_group_key_names_the_key_it_meant(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.yml", "all:\n  children:\n    gpu:\n      host:\n"
                    "        h1:\n")
    with pytest.raises(ConfigError, match="unknown key 'host' - did you mean 'hosts'"):
        inventory.load(root)


def test_ini_errors_name_the_line(tmp_path: Path) -> None:
    for text, why in [("[gpu:varz]\n", "line 1: [gpu:varz] is not a section"),
                      ("[gpu]\nh1 oops\n", "line 2: 'oops' after host 'h1' is not key=value"),
                      ("[gpu:vars]\nport=1\n[x]\n", "variables for group 'gpu'"),
                      ("[a:children]\nb\n[b:children]\na\n", "is its own child"),
                      ("[gpu]\nh1 x='open\n", "line 2: No closing quotation")]:
        (tmp_path / "a").mkdir(exist_ok=True)
        root = tmp_path / "a"
        (root / "hosts.ini").write_text(text)
        with pytest.raises(ConfigError, match=re.escape(why)):
            inventory.load(root)


def test_ansible_groups_merge_by_depth_then_name(tmp_path: Path) -> None:
    """Ansible's order of group variables: a child beats its parent, then by name, and
    ansible_group_priority before the name."""
    root = _ansible(tmp_path, "hosts.ini", "[zeta]\nh1\n[alpha]\nh1\n[parent:children]\n"
                    "zeta\n[parent:vars]\nport=1\n[zeta:vars]\nport=3\n[alpha:vars]\nport=2\n")
    assert inventory.load(root).host_vars("h1").port == 3  # zeta after alpha by name
    (root / "hosts.ini").write_text("[zeta]\nh1\n[alpha]\nh1\n[alpha:vars]\nport=2\n"
                                    "ansible_group_priority=5\n[zeta:vars]\nport=3\n")
    assert inventory.load(root).host_vars("h1").port == 2


@pytest.mark.parametrize(("pattern", "chosen"), [
    ("fleet:!h200", ["h100-01", "h100-02", "h100-03", "h100-04", "bw-01"]),
    ("fleet,!h200", ["h100-01", "h100-02", "h100-03", "h100-04", "bw-01"]),
    ("gpu:&fleet:!bw-01", ["h100-01", "h100-02", "h100-03", "h100-04"]),
    ("h100-*", ["h100-01", "h100-02", "h100-03", "h100-04"]),
    ("h100-[02:03]", ["h100-02", "h100-03"]),
    ("~h200-[ab]", ["h200-a", "h200-b"]),
    ("!fleet", ["bastion"]),
    ("h2*:bastion", ["h200-a", "h200-b", "bastion"]),
    ("*", ["bastion", "h100-01", "h100-02", "h100-03", "h100-04", "bw-01", "h200-a",
           "h200-b"]),
])
def test_hosts_patterns_select_as_ansibles_limit(tmp_path: Path, pattern: str,
                                                 chosen: list[str]) -> None:
    assert inventory.load(_ansible(tmp_path, "hosts.ini", INI)).select(pattern) == chosen


@pytest.mark.parametrize(("pattern", "why"), [
    ("gpu:!h100-5", "no host or group named 'h100-5' - did you mean"),  # never deploy to it
    ("a100-*", "'a100-*' matches no host or group"),
    ("gpu:!gpu", "selects no host"),
    ("", "--hosts is empty"),
    ("h100-[01:09]", "no host named 'h100-05'"),
    ("~h(", "not a regular expression"),
])
def test_a_pattern_that_misses_is_one_error(tmp_path: Path, pattern: str, why: str) -> None:
    inv = inventory.load(_ansible(tmp_path, "hosts.ini", INI))
    with pytest.raises(ConfigError, match=re.escape(why)):
        inv.select(pattern)


# -- files: both extensions, folders, two of one, unread files --------------------------


def test_yaml_extension_is_read_for_every_inventory_file(inv_dir: Path) -> None:
    (inv_dir / "hosts.yml").rename(inv_dir / "hosts.yaml")
    (inv_dir / "group_vars" / "all.yml").rename(inv_dir / "group_vars" / "all.yaml")
    (inv_dir / "host_vars" / "llm-two.yml").unlink()
    (inv_dir / "host_vars" / "llm-two.yaml").write_text("port: 8123\n")
    (inv_dir / "models" / "glm-5.yml").rename(inv_dir / "models" / "glm-5.yaml")
    inv = inventory.load(inv_dir)
    assert inv.host_vars("llm-two").port == 8123
    assert inv.host_vars("llm-one").env == {"HF_HUB_OFFLINE": "1"}  # all.yaml
    assert "glm-5" in inv.names("models") and inv.profile("glm-5").name == "glm-5"
    assert inv.warnings == ()
    assert inv.resolve("llm-two").origin["port"] == "host_vars/llm-two.yaml"


def test_a_group_vars_folder_merges_its_files_in_name_order(inv_dir: Path) -> None:
    folder = inv_dir / "group_vars" / "blackwell8"
    (inv_dir / "group_vars" / "blackwell8.yml").rename(inv_dir / "b8.yml")
    folder.mkdir()
    (inv_dir / "b8.yml").rename(folder / "00-hardware.yml")
    (folder / "20-net.yaml").write_text("port: 8200\nenv: {B: net}\n")
    (folder / "10-base.yml").write_text("port: 8100\nenv: {A: base}\n")
    (inv_dir / "host_vars" / "llm-one").mkdir()
    (inv_dir / "host_vars" / "llm-one" / "x.yml").write_text("restart_sec: 11\n")
    inv = inventory.load(inv_dir)
    one = inv.resolve("llm-one")
    assert one.vars.port == 8200 and one.vars.env == {"HF_HUB_OFFLINE": "1", "A": "base",
                                                      "B": "net"}
    assert one.vars.gpu is not None and one.vars.gpu.count == 8
    assert one.origin["env.A"] == "group_vars/blackwell8/10-base.yml"
    assert one.origin["port"] == "group_vars/blackwell8/20-net.yaml"
    assert (one.vars.restart_sec, one.origin["restart_sec"]) == (11, "host_vars/llm-one/x.yml")


@pytest.mark.parametrize(("first", "second", "why"), [
    ("hosts.yaml", None, "two hosts files: hosts.yml and hosts.yaml"),
    ("hosts.ini", None, "two hosts files: hosts.yml and hosts.ini"),
    ("group_vars/blackwell8.yaml", None, "group 'blackwell8' has variables twice"),
    ("group_vars/blackwell8/x.yml", None, "blackwell8/ and blackwell8.yml"),
    ("host_vars/llm-two.yaml", None, "host 'llm-two' has variables twice"),
    ("models/glm-5.yaml", "glm-5", "model 'glm-5' is given twice"),
])
def test_two_files_for_one_thing_are_one_error(inv_dir: Path, first: str, second: str | None,
                                               why: str) -> None:
    (inv_dir / first).parent.mkdir(parents=True, exist_ok=True)
    (inv_dir / first).write_text("{}\n")
    with pytest.raises(ConfigError, match=re.escape(why)) as err:
        inventory.load(inv_dir).profile(second or "glm-5")
    assert "keep one" in str(err.value)


def test_a_file_vigil_does_not_read_is_a_warning_naming_it(inv_dir: Path) -> None:
    (inv_dir / "inventory.cfg").write_text("x\n")
    (inv_dir / "group_vars" / "all.conf").write_text("port: 1\n")
    (inv_dir / "models" / "new.json").write_text("{}\n")
    (inv_dir / "hosts.d").mkdir()
    (inv_dir / "hosts.d" / "more.toml").write_text("\n")
    (inv_dir / "playbooks").mkdir()
    # Ansible's ignored files, hidden files and vigil's own known_hosts pass quietly
    for quiet in ("README.md", "hosts.yml~", ".gitignore", "known_hosts",
                  "group_vars/all.yml.bak"):
        (inv_dir / quiet).write_text("\n")
    warnings = inventory.load(inv_dir).warnings
    for name in ("inventory.cfg", "group_vars/all.conf", "models/new.json",
                 "hosts.d/more.toml", "playbooks/"):
        assert any(f"not read: {inv_dir / name}" in w for w in warnings), (name, warnings)
    assert len(warnings) == 5, warnings


def test_an_inventory_without_hosts_file_names_the_one_it_found(inv_dir: Path) -> None:
    (inv_dir / "hosts.yml").rename(inv_dir / "inventory.yml")
    with pytest.raises(ConfigError, match=r"rename it hosts\.yml"):
        inventory.load(inv_dir)


def test_an_inventory_may_be_one_hosts_file_with_group_vars_beside_it(
        tmp_path: Path) -> None:
    root = _ansible(tmp_path, "prod.ini", INI)
    (root / "staging.ini").write_text("[gpu]\nother\n")
    inv = inventory.load(root / "prod.ini")
    assert "other" not in inv.hosts and inv.host_vars("h100-01").gpu is not None
    with pytest.raises(ConfigError, match="no hosts file"):
        inventory.load(root)  # the folder itself has no hosts file


def test_ansible_group_vars_of_a_group_not_here_is_a_warning_but_a_near_miss_an_error(
        tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", INI)
    (root / "group_vars" / "webservers.yml").write_text("port: 1\n")
    inv = inventory.load(root)
    assert any("webservers.yml (no group 'webservers'" in w for w in inv.warnings)
    (root / "group_vars" / "gpus.yml").write_text("port: 1\n")
    with pytest.raises(ConfigError, match="did you mean 'gpu'"):
        inventory.load(root)


# -- precedence: Ansible's, with the file of every key ---------------------------------


def test_host_vars_file_beats_inline_host_vars_as_in_ansible(inv_dir: Path) -> None:
    (inv_dir / "hosts.yml").write_text(
        "hosts:\n  llm-one: {port: 8001, restart_sec: 5}\n  llm-two: {}\n"
        "groups:\n  blackwell8:\n    hosts: [llm-one, llm-two]\n    vars: {port: 7000, "
        "keep_envs: 1, timeout_stop_s: 9}\n")
    (inv_dir / "host_vars" / "llm-one.yml").write_text("port: 8100\n")
    (inv_dir / "group_vars" / "blackwell8.yml").write_text(
        (inv_dir / "group_vars" / "blackwell8.yml").read_text() + "keep_envs: 2\n")
    (inv_dir / "group_vars" / "all.yml").write_text("timeout_stop_s: 30\n")
    one = inventory.load(inv_dir).resolve("llm-one")
    assert (one.vars.port, one.origin["port"]) == (8100, "host_vars/llm-one.yml")
    assert (one.vars.restart_sec, one.origin["restart_sec"]) == (5, "hosts.yml: hosts.llm-one")
    assert (one.vars.keep_envs, one.origin["keep_envs"]) == (2, "group_vars/blackwell8.yml")
    # Ansible: a hosts file's group vars are below every group_vars/ file, all's too
    assert (one.vars.timeout_stop_s, one.origin["timeout_stop_s"]) == (30,
                                                                        "group_vars/all.yml")


def test_a_merged_dict_names_the_file_of_every_key(inv_dir: Path) -> None:
    (inv_dir / "group_vars" / "blackwell8.yml").write_text(
        (inv_dir / "group_vars" / "blackwell8.yml").read_text() + "env: {A: group}\n")
    (inv_dir / "host_vars" / "llm-one.yml").write_text("env: {B: host}\n")
    res = inventory.load(inv_dir).resolve("llm-one", {"env": {"C": "flag"}})
    assert res.origin["env.HF_HUB_OFFLINE"] == "group_vars/all.yml"
    assert res.origin["env.A"] == "group_vars/blackwell8.yml"
    assert res.origin["env.B"] == "host_vars/llm-one.yml"
    assert res.origin["env.C"] == "--set"


# -- typo hints, --set of nested keys, fixes that name the user's paths ------------------


def test_a_profile_key_typo_names_the_key_it_meant(inv_dir: Path) -> None:
    prof = inv_dir / "models" / "glm-5.yml"
    prof.write_text(prof.read_text() + "tensor-parallel-size: 4\n")
    with pytest.raises(ConfigError) as err:
        inventory.load(inv_dir).profile("glm-5")
    assert "models/glm-5.yml" in str(err.value)
    assert "tensor-parallel-size: unknown key - did you mean 'tensor_parallel_size'?" \
        in str(err.value)


def test_a_stack_key_typo_names_the_key_it_meant_at_any_depth(inv_dir: Path) -> None:
    st = inv_dir / "stacks" / "lab-cpu.yml"
    text = st.read_text()
    st.write_text(text + "pakages: {}\n")
    with pytest.raises(ConfigError, match="pakages: unknown key - did you mean 'packages'"):
        inventory.load(inv_dir).stack("lab-cpu")
    # one rules: key (a second one is a duplicate key, refused on its own)
    data = yaml.safe_load(text)
    data["rules"] = {"requires": [{"package": "vllm", "needs": {"torch": "2.9"},
                                   "verison": "1"}]}
    st.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=re.escape(
            "rules.requires.0.verison: unknown key - did you mean 'version'?")):
        inventory.load(inv_dir).stack("lab-cpu")


def test_a_nested_host_key_typo_names_its_file_and_the_key_it_meant(inv_dir: Path) -> None:
    (inv_dir / "host_vars" / "llm-one.yml").write_text("gpu: {kind: x, count: 8, "
                                                       "memory_gib: 9, cuont: 1}\n")
    with pytest.raises(ConfigError) as err:
        inventory.load(inv_dir).host_vars("llm-one")
    assert "gpu.cuont: unknown key - did you mean 'count'?" in str(err.value)
    assert f"(set in {inv_dir / 'host_vars' / 'llm-one.yml'})" in str(err.value)


def test_a_set_typo_names_the_key_it_meant_and_the_users_inventory(inv_dir: Path) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(inventory.load(inv_dir), "llm-one", sets=["tensor-parallel-size=4"],
                operator_env=ENV)
    assert "did you mean 'tensor_parallel_size'?" in str(err.value)
    assert str(inv_dir / "models") in str(err.value)
    assert str(REPO_INV) not in str(err.value)


def test_set_of_a_nested_key_sets_that_key_of_the_mapping(inv_dir: Path) -> None:
    host, profile = parse_sets(["gpu.count=4", "env.X=1", "env.Y=two", "overrides.dtype=half"])
    assert host == {"gpu": {"count": 4}, "env": {"X": "1", "Y": "two"},
                    "overrides": {"dtype": "half"}} and profile == {}
    (t,) = resolve(inventory.load(inv_dir), "llm-one", model="qwen3.6-27b",
                   sets=["gpu.count=4", "env.X=1"], operator_env=ENV)
    assert t.vars.gpu is not None and (t.vars.gpu.count, t.vars.gpu.memory_gib) == (4, 95.6)
    assert t.vars.env == {"HF_HUB_OFFLINE": "1", "X": "1"}
    assert t.origin["env.X"] == "--set" and t.origin["env.HF_HUB_OFFLINE"] == \
        "group_vars/all.yml"


@pytest.mark.parametrize(("item", "why"), [
    ("port.x=1", "--set port.x: port is not a mapping"),
    ("gpu.cont=4", "--set gpu.cont: gpu has no key 'cont' - did you mean 'count'?"),
    ("gpu.count.x=4", "gpu has no key 'count'"),
    ("env..X=1", "a dotted name has an empty part"),
    ("max_model_len.x=1", "max_model_len is not a mapping"),
])
def test_set_of_a_nested_key_that_cannot_be_is_refused_as_such(item: str, why: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(why)):
        parse_sets([item])


def test_no_model_fix_names_the_users_inventory(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\nbw-01\n")
    shutil.rmtree(root / "models")
    (root / "models").mkdir()
    with pytest.raises(ConfigError) as err:
        resolve(inventory.load(root), "bw-01", operator_env=ENV)
    text = str(err.value)
    assert f"none yet: {root / 'models'} is empty" in text and "(one of: )" not in text
    assert str(root / "host_vars" / "bw-01.yml") in text


def test_missing_weights_fix_names_the_profile_key_path() -> None:
    from tests.doubles import facts_for, target
    from vigil.deploy.preflight import problems

    t = target()
    found = [e for e in problems("llm-one", t.profile, t.rendered,
                                 facts_for(t, model={"exists": False}), stack=t.stack)
             if "does not exist" in str(e)]
    assert found and "`path:` in models/glm-5.yml" in str(found[0])
    assert "`model:`" not in str(found[0])


# -- a misspelled phase: one refusal for every task, the key once ------------------------


def test_a_misspelled_phase_is_refused_for_every_task_with_its_file_and_the_key_once(
        inv_dir: Path) -> None:
    (inv_dir / "host_vars" / "llm-one.yml").write_text("phase_budget_s: {kv_cahce: 60}\n")
    inv = inventory.load(inv_dir)
    # render and verify resolve targets; status and logs read host_vars: all refuse
    for call in (lambda: resolve(inv, "llm-one", model="glm-5", operator_env=ENV,
                                 require_secrets=False),
                 lambda: inv.host_vars("llm-one")):
        with pytest.raises(ConfigError) as err:
            call()
        text = str(err.value)
        assert text.startswith(f"{inv_dir / 'host_vars' / 'llm-one.yml'}: phase_budget_s: "
                               "no watched phase named 'kv_cahce' - did you mean 'kv_cache'?")
        assert text.count("phase_budget_s") == 1, text
    with pytest.raises(ConfigError, match=re.escape("--set: stall_window_s: no watched "
                                                    "phase named 'compile'")):
        inv.host_vars("llm-two", {"stall_window_s": {"compile": 5}})


def test_phase_defaults_refusal_names_the_key_once() -> None:
    from vigil.verify.budgets import phase_defaults

    with pytest.raises(ConfigError) as err:
        phase_defaults({"kv_cahce": 1.0}, {})
    assert str(err.value).count("phase_budget_s") == 1, str(err.value)


def test_the_watched_phases_of_the_inventory_are_the_catalogs() -> None:
    from vigil.desired.config import WATCHED_PHASES as DESIRED
    from vigil.verify.budgets import WATCHED_PHASES

    assert DESIRED == WATCHED_PHASES


# -- issue 29.1: a host with no address is reached at its name, never the controller ----


def test_a_host_without_an_address_is_reached_at_its_inventory_name(tmp_path: Path) -> None:
    """gpu-[01:04] with no ansible_host is gpu-02 to ssh (its ssh config block applies),
    as ssh and Ansible reach it; never 127.0.0.1, and render says where it came from."""
    from vigil.desired import review

    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-[01:04] model=glm-5\n"
                    "[here]\nlocalhost ansible_connection=local model=glm-5\n")
    inv = inventory.load(root)
    assert [inv.host_vars(h).address for h in inv.groups["gpu"]] == [
        "gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    assert inv.resolve("gpu-02").origin["address"] == inventory.ADDRESS_NAME
    here = inv.resolve("localhost")  # loopback only when asked for
    assert (here.vars.address, here.origin["address"]) == ("127.0.0.1",
                                                           inventory.ADDRESS_LOCAL)
    (t,) = resolve(inv, "gpu-02", operator_env=ENV)
    (line,) = [x for x in review.variables(t) if x.startswith("address ")]
    assert '"gpu-02"' in line and "inventory name" in line and "vigil default" not in line
    assert "127.0.0.1" not in line


def test_an_explicit_address_wins_over_the_inventory_name(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-01 ansible_host=10.1.2.3\n"
                    "gpu-02 address=127.0.0.1\n")
    inv = inventory.load(root)
    assert inv.host_vars("gpu-01").address == "10.1.2.3"
    assert inv.resolve("gpu-01").origin["address"] == "hosts.ini: host gpu-01"
    assert inv.host_vars("gpu-02").address == "127.0.0.1"  # asked for: kept


def test_ssh_config_hostname_applies_to_a_host_reached_at_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.transport.ssh import SSHTransport

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host gpu-02\n  HostName 10.9.8.7\n"
                                          "  User ops\n  Port 40022\n")
    monkeypatch.setenv("HOME", str(home))
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-[01:02]\n")
    t = SSHTransport("gpu-02", inventory.load(root).host_vars("gpu-02"))
    assert (t.conn.host, t.login_user, t.login_port) == ("10.9.8.7", "ops", 40022)
    assert SSHTransport("gpu-01", inventory.load(root).host_vars("gpu-01")).conn.host \
        == "gpu-01"


@pytest.mark.parametrize("pattern", ["all", "*", "here", "local*", "all:!gpu-01"])
def test_a_changing_task_reaches_the_controller_only_where_its_name_is_said(
        tmp_path: Path, pattern: str) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-01\n"
                    "[here]\nlocalhost ansible_connection=local\n")
    inv = inventory.load(root)
    with pytest.raises(ConfigError) as err:
        inv.refuse_controller(pattern, "deploy")
    text = str(err.value)
    assert "localhost, which is this machine (connection: local, from hosts.ini: host " \
        "localhost): deploy would change the controller" in text, text
    assert "--hosts localhost" in text and f"--hosts '{pattern}:!localhost'" in text
    inv.refuse_controller("localhost", "deploy")  # named: meant
    inv.refuse_controller("gpu-01,localhost", "deploy")
    inv.refuse_controller("all:!localhost", "deploy")
    inv.refuse_controller("gpu", "deploy")


# -- issue 29.5: a key set aside in group_vars/ or host_vars/ is said, with its file -----


def test_a_foreign_key_in_host_vars_or_group_vars_is_a_warning_naming_the_file(
        tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-01 model=glm-5\n")
    (root / "host_vars").mkdir()
    (root / "host_vars" / "gpu-01.yml").write_text("ntp_servers: [ntp1]\n")
    (root / "group_vars" / "gpu.yml").write_text("nvidia_driver: 550\n"
                                                 "ansible_python_interpreter: /usr/bin/py\n")
    warnings = inventory.load(root).warnings
    assert any("'ntp_servers'" in w and "host_vars/gpu-01.yml" in w for w in warnings), warnings
    assert any("'nvidia_driver'" in w and "group_vars/gpu.yml" in w for w in warnings)
    assert any("'ansible_python_interpreter'" in w and "group_vars/gpu.yml" in w
               for w in warnings)


def test_a_profile_field_set_on_a_host_says_where_it_belongs(tmp_path: Path) -> None:
    """max_model_len in host_vars/ is a profile field: the unit would keep the profile's
    8192; the warning says overrides: or --set, and the file."""
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-01 model=glm-5\n")
    (root / "host_vars").mkdir()
    (root / "host_vars" / "gpu-01.yml").write_text("max_model_len: 4096\n")
    (line,) = [w for w in inventory.load(root).warnings if "max_model_len" in w]
    assert "host_vars/gpu-01.yml" in line and "model profile field" in line
    assert "overrides: {max_model_len: ...}" in line and "--set max_model_len=" in line
    assert "4096" not in line  # values are not echoed (one might be a secret)


def test_a_profile_field_in_vigils_own_format_is_an_error_saying_where_it_belongs(
        inv_dir: Path) -> None:
    (inv_dir / "host_vars" / "llm-one.yml").write_text("tensor_parallel_size: 4\n")
    with pytest.raises(ConfigError) as err:
        inventory.load(inv_dir)
    text = str(err.value)
    assert "host_vars/llm-one.yml" in text and "'tensor_parallel_size'" in text
    assert "overrides: {tensor_parallel_size: ...}" in text


# -- issue 29.8: a Jinja template in an inventory value is said, never used silently ----


def test_a_templated_inventory_value_is_one_warning_naming_it(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-[01:02] model=glm-5\n")
    (root / "group_vars" / "gpu.yml").write_text(
        'env: {NCCL_SOCKET_IFNAME: "{{ ansible_default_ipv4.interface }}", A: plain}\n'
        'service: "{% if x %}vllm{% endif %}"\n'
        'playbook_var: "{{ not_vigils }}"\n')  # set aside already: no second word
    inv = inventory.load(root)
    lines = [w for w in inv.warnings if "template" in w]
    assert len(lines) == 2, inv.warnings
    env, service = sorted(lines)
    assert env.startswith("'env.NCCL_SOCKET_IFNAME' in group_vars/gpu.yml holds a template")
    assert "vigil does not template inventory values" in env
    assert "ansible_default_ipv4" not in env  # the value is not echoed
    assert service.startswith("'service' in group_vars/gpu.yml")
    assert not any("'env.A'" in w for w in inv.warnings)


# -- issue 29.12: every selected host's inputs are checked before the first connection --


def test_a_missing_key_file_of_one_host_is_refused_before_any_host(tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-[01:08] model=glm-5\n")
    (root / "host_vars").mkdir()
    (root / "host_vars" / "gpu-08.yml").write_text("ssh_key: keys/deploy\n")
    inv = inventory.load(root)
    with pytest.raises(ConfigError) as err:
        inv.check_inputs("all")
    text = str(err.value)
    assert text.startswith("host_vars/gpu-08.yml: ssh_key: host gpu-08: ssh_key "
                           f"{root / 'keys/deploy'} does not exist"), text
    assert err.value.exit_code == 2
    with pytest.raises(ConfigError, match="ssh_key"):  # deploy's and verify's path too
        resolve(inv, "all", operator_env=ENV)
    assert len(inv.check_inputs("all:!gpu-08")) == 7
    (root / "keys").mkdir()
    (root / "keys" / "deploy").write_text("key\n")
    assert len(inv.check_inputs("all")) == 8


def test_a_strict_known_hosts_file_that_is_missing_is_refused_before_any_host(
        tmp_path: Path) -> None:
    root = _ansible(tmp_path, "hosts.ini", "[gpu]\ngpu-01 known_hosts=/nonexistent/kh\n"
                    "gpu-02 known_hosts=/nonexistent/kh host_key=accept-new\n")
    inv = inventory.load(root)
    with pytest.raises(ConfigError, match="known_hosts file /nonexistent/kh does not exist"):
        inv.check_inputs("gpu-01")
    inv.check_inputs("gpu-02")  # accept-new creates it
