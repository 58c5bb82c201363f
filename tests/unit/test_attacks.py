"""The attack list of issue 8, one test per attack, so the next review can re-run it.

Each test is named for the attack it replays (``test_a<N>_...`` for item N of the
issue; ``test_i21_<N>_...`` for item N of issue 21, in its own section at the end).
Attacks that need a real sshd run against a lab host and are marked ``lab``.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.doubles import fake_home, linked_inventory, other_key
from tests.paths import FIXTURES, REPO, TRACES
from vigil.deploy.plan import env_diff
from vigil.desired.config import HostVars
from vigil.desired.render import mask_env_text
from vigil.desired.targets import Target
from vigil.errors import ConfigError, TemplateError, UnreachableError
from vigil.transport.hostkeys import KnownHosts, host_matches, known_hosts_files, load_known_hosts
from vigil.transport.ssh import SSHTransport

# -- 1. the user's known_hosts files are read, the way ssh reads them --------------------


def test_a1_known_hosts_files_are_the_ones_ssh_reads(tmp_path: Path) -> None:
    home = tmp_path
    assert known_hosts_files({}, home) == [
        home / ".ssh/known_hosts", home / ".ssh/known_hosts2",
        Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2"),
    ]
    cfg = {"userknownhostsfile": "~/kh '/srv/with space/kh' %d/third",
           "globalknownhostsfile": "none"}
    assert known_hosts_files(cfg, home) == [
        home / "kh", Path("/srv/with space/kh"), home / "third"]


def test_a1_wildcard_and_negated_patterns_match_as_ssh_matches_them() -> None:
    assert host_matches("*.gpu.example", "node7.gpu.example")
    assert host_matches("node?.GPU.example", "node7.gpu.example")
    assert not host_matches("*.gpu.example", "gpu.example")
    assert host_matches("[10.0.0.*]:2222", "[10.0.0.5]:2222")  # `[` is literal
    assert not host_matches("[10.0.0.*]:2222", "10.0.0.5")
    assert not host_matches("*.gpu.example,!node7.gpu.example", "node7.gpu.example")
    assert host_matches("a,*.gpu.example,!node7.gpu.example", "node8.gpu.example")


def test_a1_known_hosts_lines_are_sorted_by_what_ssh_makes_of_them(tmp_path: Path) -> None:
    import paramiko
    keytype, data = other_key(tmp_path)
    text = (f"plain.example {keytype} {data}\n*.fleet.example {keytype} {data}\n"
            f"@cert-authority *.corp.example {keytype} {data}\n"
            f"@revoked * {keytype} {data}\nbroken.example {keytype} AAAA!!\n")
    keys, known = paramiko.HostKeys(), KnownHosts()
    load_known_hosts(text, keys, tmp_path / "kh", known)
    assert list(keys.keys()) == ["plain.example"]
    assert [p for p, _, _ in known.patterns] == ["*.fleet.example"]
    assert known.authorities == [("*.corp.example", tmp_path / "kh")]
    assert known.revoked == {data}


# -- 2. no silent opt-out: pinned fingerprints or an explicit, loud accept-new ---------------


def test_a2_host_key_check_false_is_refused_with_the_choices(tmp_path: Path) -> None:
    from tests.doubles import target_in

    with pytest.raises(ConfigError) as err:
        target_in(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu, "
                  "host_key_check: false}\n", "h1")
    text = str(err.value)
    assert "host_key_check was removed" in text
    assert "host_key_fingerprints" in text and "accept-new" in text
    assert "got False" not in text


def test_a2_a_fingerprint_must_look_like_one() -> None:
    with pytest.raises(ValueError, match="not a SHA256 fingerprint"):
        HostVars(host_key_fingerprints=["MD5:aa:bb"])


def test_a2_accept_new_defaults_to_the_inventorys_known_hosts(tmp_path: Path) -> None:
    from vigil.desired import inventory

    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("hosts:\n  h1: {host_key: accept-new}\n")
    assert inventory.load(inv).host_vars("h1").known_hosts == str(inv / "known_hosts")


def test_a2_a_strict_run_reads_the_keys_an_accept_new_run_recorded(tmp_path: Path) -> None:
    """Issue 22.8: once accept-new wrote the inventory's known_hosts, a strict run (the
    default) reads it too; before any exists, strict reads only ssh's own files."""
    from vigil.desired import inventory

    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("hosts:\n  h1: {address: 10.0.0.1}\n")
    assert inventory.load(inv).host_vars("h1").known_hosts is None
    (inv / "known_hosts").write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    assert inventory.load(inv).host_vars("h1").known_hosts == str(inv / "known_hosts")


# -- 3. connect timeouts below a second are kept, not truncated to "none" --------------------


def test_a3_sub_second_connect_timeout_is_kept() -> None:
    t = SSHTransport("h", HostVars(address="127.0.0.1", ssh_port=9, connect_timeout_s=0.5))
    assert t.conn.connect_timeout == 0.5
    with pytest.raises(ValueError):
        HostVars(connect_timeout_s=0)


def test_a3_sub_second_banner_timeout_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_home(tmp_path, monkeypatch)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        hv = HostVars(address="127.0.0.1", ssh_port=listener.getsockname()[1],
                      connect_timeout_s=0.5)
        t = SSHTransport("h", hv)
        with pytest.raises(UnreachableError, match=r"timed out after 0\.5 s"):
            t.run("true")
    finally:
        listener.close()


# -- 4. a --check diff shows names and hashes, never a value vigil does not render openly ----


def _env_target(tmp_path: Path, secret_env: str = "[]", **env: str) -> Target:
    from tests.doubles import target_in

    return target_in(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu, "
                     f"secret_env: {secret_env}}}\n", "h1", operator_env=env)


def test_a4_check_diff_masks_variables_found_only_on_the_host(tmp_path: Path) -> None:
    t = _env_target(tmp_path)
    host = t.rendered.env_text + "DB_PASS='hunter2'\nWANDB_KEY=abc123xyz\n"
    diff = env_diff(t.rendered, host)
    assert "hunter2" not in diff and "abc123xyz" not in diff
    assert "-DB_PASS=*** (hash " in diff and "-WANDB_KEY=*** (hash " in diff
    assert "VLLM_LOGGING_LEVEL='INFO'" in diff  # public settings stay readable


def test_a4_a_secret_no_longer_in_secret_env_stays_masked(tmp_path: Path) -> None:
    # The host still holds MY_SECRET (it was in secret_env); now it is not declared.
    old = _env_target(tmp_path / "old", "[MY_SECRET]", MY_SECRET="s3cr3t-value")
    new = _env_target(tmp_path / "new")
    diff = env_diff(new.rendered, old.rendered.env_text)
    assert "s3cr3t-value" not in diff
    assert "-MY_SECRET=*** (hash " in diff


def test_a4_changed_secret_shows_as_a_changed_hash_only(tmp_path: Path) -> None:
    old = _env_target(tmp_path / "old", "[MY_SECRET]", MY_SECRET="first-value")
    new = _env_target(tmp_path / "new", "[MY_SECRET]", MY_SECRET="second-value")
    diff = env_diff(new.rendered, old.rendered.env_text)
    assert "first-value" not in diff and "second-value" not in diff
    assert diff.count("MY_SECRET=*** (hash ") == 2
    same = env_diff(new.rendered, new.rendered.env_text)
    assert same == ""


# -- 5. line separators other than \n ------------------------------------------------------


@pytest.mark.parametrize("sep", ["\u2028", "\u0085", "\u2029", "\x1c"])
def test_a5_secret_with_a_unicode_line_separator_is_fully_masked(
    tmp_path: Path, sep: str
) -> None:
    secret = f"part-one{sep}part-two"
    t = _env_target(tmp_path, "[MY_SECRET]", MY_SECRET="x")
    host = t.rendered.env_text.replace("MY_SECRET='x'", f"MY_SECRET='{secret}'")
    assert secret in host
    shown = env_diff(t.rendered, host) + mask_env_text(host, t.rendered.secret_names)
    assert "part-one" not in shown and "part-two" not in shown


@pytest.mark.parametrize("sep", ["\\u2028", "\\x85", "\\u2029"])  # YAML escapes
def test_a5_unicode_line_separator_in_served_model_name_is_refused(
    tmp_path: Path, sep: str
) -> None:
    from tests.doubles import target_in

    with pytest.raises(ConfigError, match="served_model_name"):
        target_in(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu, overrides: "
                  f"{{served_model_name: \"a{sep}b\"}}}}\n", "h1")


def test_a5_status_reads_a_unit_with_a_line_separator_in_a_value() -> None:
    # A unit vigil did not write (or an older one): status must not crash on it.
    from vigil.deploy.service import exec_flag

    assert exec_flag('"--model=/m" "--served-model-name=a\u2028b"', "served-model-name") \
        == "a\u2028b"
    assert exec_flag('"--model=/m" "--served-model-name=a', "served-model-name") is None
    # 6 MB of it from a host's status: not split at all (shlex spun 16 min on it)
    assert exec_flag("--model=/m --served-model-name=" + "a" * 6_000_000,
                     "served-model-name") is None


# -- 7. a wrong-typed secret is not echoed ------------------------------------------------------


@pytest.mark.parametrize("where", ["env: {HF_TOKEN: 12345}",
                                   "env: {WANDB_KEY: [9876543]}",
                                   "overrides: {env: {ANY: 24680}}"])
def test_a7_wrong_typed_env_value_is_not_echoed(tmp_path: Path, where: str) -> None:
    from tests.doubles import target_in

    with pytest.raises(ConfigError) as err:
        target_in(tmp_path, f"hosts:\n  h1: {{model: tiny-cpu, stack: lab-cpu, {where}}}\n",
                  "h1")
    text = str(err.value)
    assert "env" in text
    for digits in ("12345", "9876543", "24680"):
        assert digits not in text


# -- 9. every name that becomes a path has one strict pattern ----------------------------------


@pytest.mark.parametrize("flag", ["--model", "--stack"])
@pytest.mark.parametrize("name", ["../../x", "/some/path", ".hidden", "a/b", "x" * 101])
def test_a9_model_or_stack_outside_the_inventory_is_refused(
    tmp_path: Path, flag: str, name: str
) -> None:
    from vigil.desired import inventory, targets

    inv = _inventory(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu}\n")
    kwargs = {"model": name} if flag == "--model" else {"stack": name}
    with pytest.raises(ConfigError, match="is not a name"):
        targets.resolve(inventory.load(inv), "h1", operator_env={}, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("host", ["../../x", "x" * 300, ".h", "a b"])
def test_a9_host_names_that_would_be_paths_are_refused(tmp_path: Path, host: str) -> None:
    from vigil.desired import inventory

    inv = _inventory(tmp_path, f"hosts:\n  '{host}': {{model: tiny-cpu}}\n")
    with pytest.raises(ConfigError, match="must be 1-100 letters"):
        inventory.load(inv)


def test_a9_stack_file_without_a_name_gets_the_file_name(tmp_path: Path) -> None:
    from vigil.desired import inventory

    inv = _inventory(tmp_path, "hosts:\n  h1: {model: tiny-cpu}\n")
    with pytest.raises(ConfigError, match="is not a name"):
        inventory.load(inv).stack("../stacks/lab-cpu")


@pytest.mark.parametrize("root", ["/opt/vigil/../../etc", "relative/envs", "/opt/\u2028x"])
def test_a9_env_root_with_dot_dot_is_refused(root: str) -> None:
    with pytest.raises(ValueError, match="absolute path"):
        HostVars(env_root=root)


# -- 14. strict types: no bool for an int, no string for a number --------------------------------


@pytest.mark.parametrize("key,value", [("port", "true"), ("ssh_port", "true"),
                                       ("port", '"8000"'), ("connect_timeout_s", "true")])
def test_a14_bool_or_string_is_not_a_host_number(tmp_path: Path, key: str, value: str) -> None:
    from tests.doubles import target_in

    with pytest.raises(ConfigError, match=key):
        target_in(tmp_path, f"hosts:\n  h1: {{model: tiny-cpu, stack: lab-cpu, {key}: {value}}}\n",
                  "h1")


@pytest.mark.parametrize("key", ["tensor_parallel_size", "max_model_len", "enforce_eager"])
def test_a14_wrong_types_in_a_profile_are_refused(tmp_path: Path, key: str) -> None:
    from tests.doubles import target_in

    value = "true" if key != "enforce_eager" else "1"
    with pytest.raises(ConfigError, match=key):
        target_in(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu, overrides: "
                  f"{{{key}: {value}}}}}\n", "h1")


# -- 15. controller inputs ---------------------------------------------------------------------


@pytest.mark.parametrize("item", ["port=[1", "served_model_name={a", "env=: :"])
def test_a15_yaml_error_in_set_is_one_clear_error(item: str) -> None:
    from vigil.desired.targets import parse_sets

    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_sets([item])


def test_a15_model_flag_and_set_model_must_agree(tmp_path: Path) -> None:
    from vigil.desired import inventory, targets

    inv = inventory.load(_inventory(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu}\n"))
    with pytest.raises(ConfigError, match="disagree"):
        targets.resolve(inv, "h1", model="tiny-cpu", sets=["model=glm-5"], operator_env={})
    (t,) = targets.resolve(inv, "h1", model="tiny-cpu", sets=["model=tiny-cpu"],
                           operator_env={})
    assert t.profile.name == "tiny-cpu"


def test_a15_max_model_len_is_bounded_without_a_model_limit(tmp_path: Path) -> None:
    from tests.doubles import target_in

    with pytest.raises(ConfigError, match="max_model_len"):
        target_in(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu, overrides: "
                  "{max_model_len: 1000000000000, max_position_embeddings: null}}\n", "h1")


def _inventory(tmp_path: Path, hosts_yml: str) -> Path:
    import shutil

    from tests.paths import REPO

    inv = tmp_path / "inventory"
    for part in ("models", "stacks"):
        shutil.copytree(REPO / "inventory" / part, inv / part)
    (inv / "hosts.yml").write_text(hosts_yml)
    return inv


# -- 8, 9 (host side). the agent removes environments only under the env root ----------------


def _paths(tmp_path: Path) -> dict[str, str]:
    root = tmp_path / "opt" / "envs"
    root.mkdir(parents=True)
    return {"unit": str(tmp_path / "u.service"), "env": str(tmp_path / "u.env"),
            "env_dir": str(root / "stack-abc"), "current": str(root / "current"),
            "backup_dir": str(tmp_path / "backup")}


def test_a8_remove_envs_refuses_dot_dot_out_of_the_root(tmp_path: Path) -> None:
    from tests.agent_payload import agent

    paths = _paths(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data").write_text("precious")
    old = Path(paths["env_dir"]).parent / "old-env"
    old.mkdir()
    sneaky = f"{Path(paths['env_dir']).parent}/../../victim"
    res = agent.remove_envs({"paths": [str(old), sneaky]}, paths)
    assert (victim / "data").read_text() == "precious"
    assert res["ok"] is False and "refusing to remove paths outside" in res["error"]
    assert res["removed"] == [str(old)] and not old.exists()


@pytest.mark.parametrize("kind", ["discard_env", "install_env", "mark_env"])
def test_a9_agent_refuses_an_env_dir_outside_the_root(tmp_path: Path, kind: str) -> None:
    from tests.agent_payload import agent

    paths = _paths(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    reply = agent.apply({"paths": paths, "actions": [
        {"kind": kind, "env_dir": str(Path(paths["env_dir"]).parent / ".." / ".." / "victim"),
         "requirements": [], "python": "/usr/bin/python3"}]})
    (res,) = reply["results"]
    assert res["ok"] is False and "is not under" in res["error"]
    assert victim.is_dir() and not (victim / ".vigil-complete").exists()


# -- 10. kill only the process the facts saw ------------------------------------------------


@pytest.mark.parametrize("pid", [0, -1, 1, True, "12"])
def test_a10_kill_refuses_pids_up_to_1_and_non_integers(pid: object) -> None:
    from tests.agent_payload import agent

    res = agent.kill_pids({"pids": [pid], "expect": {str(pid): {"start": 1, "cmdline": "x"}}})
    assert res["ok"] is False and "refusing to signal" in res["error"]


def test_a10_kill_leaves_a_process_that_is_not_the_one_the_facts_saw() -> None:
    from tests.agent_payload import agent

    proc = subprocess.Popen(["sleep", "60"])
    try:
        for _ in range(100):  # until the child has exec'd sleep
            if agent.cmdline(proc.pid) == "sleep 60":
                break
            time.sleep(0.05)
        start, cmd = agent.start_time(proc.pid), agent.cmdline(proc.pid)
        assert start is not None and cmd == "sleep 60"
        # no expectation at all: refused
        assert agent.kill_pids({"pids": [proc.pid]})["ok"] is False
        # the PID now names another process (other start time, other command): left alone
        for wrong in ({"start": start + 1, "cmdline": cmd}, {"start": start, "cmdline": "x"}):
            res = agent.kill_pids({"pids": [proc.pid], "expect": {str(proc.pid): wrong}})
            assert res["ok"] is True and res["gone"] == [proc.pid] and res["killed"] == []
            assert proc.poll() is None
        # the very process the facts saw: ended
        res = agent.kill_pids({"pids": [proc.pid],
                               "expect": {str(proc.pid): {"start": start, "cmdline": cmd}}})
        assert res["killed"] == [proc.pid]
        assert proc.wait(timeout=15) == -15
    finally:
        proc.kill()
        proc.wait()


def test_a10_plan_carries_what_the_facts_saw_for_each_pid() -> None:
    from tests.doubles import facts_for, target
    from vigil.deploy.plan import make_plan

    t = target()
    f = facts_for(t, gpus={"cmdlines": {"4711": "python stale.py"}, "starts": {"4711": 99}})
    plan = make_plan("llm-one", t.stack, t.rendered, f, kill_pids=(4711,))
    (kill,) = [a for a in plan.actions if a.kind == "kill"]
    assert kill.payload["expect"] == {"4711": {"start": 99, "cmdline": "python stale.py"}}


# -- 11. a malformed request: a structured error that keeps what was done ---------------------


def test_a11_malformed_action_keeps_the_results_before_it(tmp_path: Path) -> None:
    from tests.agent_payload import agent

    paths = _paths(tmp_path)
    reply = agent.apply({"paths": paths, "actions": [
        {"kind": "write_unit", "content": "[Unit]\n", "mode": "644"},
        {"kind": "write_env", "mode": "600"},  # no content
        {"kind": "write_unit", "content": "never\n", "mode": "644"},
    ]})
    first, second = reply["results"]
    assert first == {"ok": True, "kind": "write_unit"}
    assert second["ok"] is False and second["malformed"] is True
    assert "malformed write_env action: KeyError" in second["error"]
    assert Path(paths["unit"]).read_text() == "[Unit]\n"


@pytest.mark.parametrize("argv,text,expect", [
    (["agent", "apply"], "{not json", "malformed apply request: JSONDecodeError"),
    (["agent", "apply"], "[1, 2]", "the request is not a JSON object"),
    (["agent", "apply"], "{}", "malformed apply request: KeyError"),
    (["agent", "nope"], "{}", "unknown verb 'nope'"),
    (["agent"], "", "unknown verb ''"),
])
def test_a11_malformed_request_is_one_json_error(
    argv: list[str], text: str, expect: str
) -> None:
    from tests.agent_payload import agent

    assert expect in agent.main(argv, text)["agent_error"]


def test_a11_controller_turns_an_agent_error_into_a_host_error() -> None:
    from vigil.errors import HostError
    from vigil.transport.base import Result
    from vigil.transport.remote import reply

    with pytest.raises(HostError, match="agent apply: malformed apply request"):
        reply("h1", "apply", Result('{"agent_error": "malformed apply request: x"}', "", 0))


def test_a11_agent_run_as_a_process_answers_json_to_garbage(tmp_path: Path) -> None:
    from vigil.transport.remote import agent_command, agent_stdin

    proc = subprocess.run(["bash", "-c", agent_command("apply")],
                          input=agent_stdin("{garbage"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert "agent_error" in proc.stdout


# -- 12. temp files of a killed write are cleaned; the directory is synced ---------------------


def test_a12_stale_temp_files_are_cleaned_by_the_next_write(tmp_path: Path) -> None:
    import os
    import time as time_mod

    from tests.agent_payload import agent

    stale = tmp_path / ".vigil-tmp-0123456789abcdef"
    stale.write_text("half a unit")
    link_tmp = tmp_path / ".vigil-tmp-fedcba9876543210"
    link_tmp.symlink_to("/nowhere")
    fresh = tmp_path / ".vigil-tmp-00000000000000ff"
    fresh.write_text("another writer's, right now")
    old = time_mod.time() - 3600
    os.utime(stale, (old, old))
    os.utime(link_tmp, (old, old), follow_symlinks=False)
    agent.write_atomic(str(tmp_path / "unit.service"), "[Unit]\n", 0o644)
    assert not stale.exists() and not link_tmp.is_symlink()
    assert fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, "unit.service"]


def test_a12_switch_link_survives_a_stale_temp_link_of_a_reused_pid(tmp_path: Path) -> None:
    import os

    from tests.agent_payload import agent

    link = tmp_path / "current"
    (tmp_path / f"current.vigil-{os.getpid()}").symlink_to("/stale")  # an older agent's
    agent.switch_link(str(link), "/opt/new")
    assert os.readlink(link) == "/opt/new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", f"current.vigil-{os.getpid()}"]


# -- 6. index credentials never reach a command line, a log line or a reply --------------------


def test_a6_index_credentials_stay_out_of_argv_logs_and_replies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import stat as stat_mod

    from tests.agent_payload import agent

    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    env_dir = tmp_path / "envs" / "s-1"
    token = "s3cr3t-T0KEN"
    reply = agent.install_env({
        "env_dir": str(env_dir), "python": "/usr/bin/python3", "installer": "pip",
        "requirements": ["vigil-no-such-package==1.0"],
        "index_url": f"http://deployer:{token}@127.0.0.1:9/simple",
        "extra_index_urls": [f"https://other:{token}@127.0.0.1:9/extra"],
    })
    assert reply["ok"] is False
    assert token not in json.dumps(reply)
    log = Path(reply["log"])
    assert stat_mod.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert token not in text
    commands = [line for line in text.splitlines() if line.startswith("$ ")]
    assert commands and all("127.0.0.1:9" not in c for c in commands)


@pytest.mark.parametrize("url,shown", [
    ("https://u:tok@h/simple", "https://***@h/simple"),
    ("see http://tok@h/x and git+https://a:b@g/r", "see http://***@h/x and git+https://***@g/r"),
    ("https://h/simple", "https://h/simple"),
])
def test_a6_redact_hides_url_credentials(url: str, shown: str) -> None:
    from tests.agent_payload import agent

    assert agent.redact(url) == shown


@pytest.mark.parametrize("line, shown", [
    ("Looking in indexes: https://pkgs.corp/simple/tk_2f9a8/, https://h2/s",
     "Looking in indexes: https://pkgs.corp/***/, https://h2/***"),
    ("ERROR: 404 for url: https://pkgs.corp/simple/tk_2f9a8/vllm/",
     "ERROR: 404 for url: https://pkgs.corp/***/vllm/"),
    ("GET https://u:p@pkgs.corp/simple/tk_2f9a8 failed", "GET https://pkgs.corp/*** failed"),
    ("fetching https://idx.corp/simple/torch/?auth=tk_2f9a8 …",
     "fetching https://idx.corp/simple/torch/?*** …"),
])
def test_an_index_urls_path_or_query_token_is_redacted_in_install_tails(
        line: str, shown: str) -> None:
    """Issue 33 (minor): a token in an index URL's path (Gemfury's /simple/<token>/) or
    query was printed in install tails: pip redacts only user:password@."""
    from tests.agent_payload import agent

    configured = ["https://u:p@pkgs.corp/simple/tk_2f9a8/", "https://h2/s"]
    assert agent.redact(line, configured) == shown
    assert "tk_2f9a8" not in agent.redact(line, configured)


# -- 13, 16. the deploy lock: rollback takes it; a lost lock stops the deploy -----------------

# Run on the lab host: SIGKILL the sshd session processes of the connection whose `cat`
# holds the lock (the waiting deploy's processes run `flock`, not `cat`).
# -- 15 (continued). files the controller writes, its mirror, its threads ---------------------


def test_a15_render_out_onto_a_file_or_through_a_planted_link_is_refused(
    tmp_path: Path
) -> None:
    from tests.doubles import target_in
    from vigil.desired.review import write_files

    t = target_in(tmp_path / "inv", "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu}\n", "h1")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    with pytest.raises(ConfigError, match="cannot write"):
        write_files(t, a_file / "h1")
    assert a_file.read_text() == "keep me"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "vllm.env").symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        write_files(t, out)
    assert victim.read_text() == "precious"
    linked_dir = tmp_path / "linked"
    linked_dir.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ConfigError, match="is a symbolic link"):
        write_files(t, linked_dir)
    assert list((tmp_path / "elsewhere").iterdir()) == []
    # a plain re-render over its own earlier output works, the env file 0600
    fresh = tmp_path / "fresh"
    write_files(t, fresh)
    write_files(t, fresh)
    assert (fresh / "vllm.env").stat().st_mode & 0o777 == 0o600


def test_a15_corrupt_rows_in_the_history_mirror_are_skipped(tmp_path: Path) -> None:
    import sqlite3

    from vigil.verify.history import Mirror

    mirror = Mirror(tmp_path / "history.sqlite")
    with sqlite3.connect(mirror.path) as db:
        for i, record in enumerate(["{not json", "[1, 2]", '{"key": 5}', "[" * 100000]):
            db.execute("INSERT INTO records VALUES (?,?,?,?,?,?,?,?)",
                       (f"bad{i}", "h1", "m", "hw", "cold", float(i), "ready", record))
    assert mirror.records() == []
    assert mirror.skipped == 4


def test_a15_a_file_that_is_not_a_database_is_one_clear_error(tmp_path: Path) -> None:
    from vigil.verify.history import Mirror

    path = tmp_path / "history.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError, match="history mirror"):
        Mirror(path).records()


def test_a15_a_worker_that_raises_a_bug_fails_its_host(tmp_path: Path) -> None:
    import io

    from tests.doubles import target_in
    from vigil.deploy import apply as apply_mod
    from vigil.deploy import rollout
    from vigil.report import Log

    t = target_in(tmp_path, "hosts:\n  h1: {connection: local, model: tiny-cpu, "
                  "stack: lab-cpu}\n", "h1")

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("a bug")

    out = io.StringIO()
    mp = pytest.MonkeyPatch()
    mp.setattr(apply_mod, "connect", broken)
    try:
        (result,) = rollout.run([t], apply_mod.Options(), Log(out)).results
    finally:
        mp.undo()
    assert result.status == "failed"
    assert result.error is not None and "internal error at test_attacks.py" in result.error
    assert "TypeError: a bug" in result.error and "FAILED" in out.getvalue()


def test_a15_parallel_raises_a_workers_bug_after_all_finished() -> None:
    from vigil.errors import InternalError
    from vigil.tasks.common import parallel

    done: list[str] = []

    def work(name: str) -> None:
        if name == "h2":
            raise KeyError("oops")
        time.sleep(0.2)
        done.append(name)

    with pytest.raises(InternalError, match=r"h2: internal error .*KeyError"):
        parallel(["h1", "h2", "h3"], work)
    assert sorted(done) == ["h1", "h3"]


# -- 16 (local). the lock's guard: a lost lock stops every next command -------------------------


def _proc_state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def test_a16_a_lost_lock_stops_the_next_command(tmp_path: Path) -> None:
    from vigil.errors import LockLostError
    from vigil.transport.local import LocalTransport
    from vigil.transport.lock import host_lock

    t = LocalTransport("here")
    hv = HostVars(connection="local")
    lock = str(tmp_path / "svc.lock")
    with host_lock(t, hv, lock, "me", 5, print):
        assert t.run("true").exit_status == 0
        # the holder dies (its connection ended): the lock is free for anyone
        holder = subprocess.run(["fuser", lock], capture_output=True, text=True).stdout.split()
        assert holder
        for pid in holder:
            subprocess.run(["kill", "-9", pid], check=True)
        for pid in holder:  # gone, however long a loaded machine takes to reap them
            while Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid):
                time.sleep(0.05)
        with pytest.raises(LockLostError, match="lost the deploy lock"):
            t.run("touch " + str(tmp_path / "changed"))
    assert not (tmp_path / "changed").exists()
    assert t.run("true").exit_status == 0  # outside the lock: no guard


def test_a15_max_model_len_is_bounded_by_the_other_keys_of_config_json(tmp_path: Path) -> None:
    # GPT-2 style config.json: no max_position_embeddings, n_positions instead
    import json

    from tests.agent_payload import agent
    from tests.doubles import facts_for, target
    from vigil.deploy.preflight import problems

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"n_positions": 1024, "seq_length": 2048,
                                                   "num_attention_heads": 64}))
    found = agent.model_facts(str(model))
    assert found["config"]["max_len_keys"] == {"n_positions": 1024, "seq_length": 2048}
    t = target("max_model_len=4096")
    f = facts_for(t, model=found)
    refused = [str(p) for p in problems("llm-one", t.profile, t.rendered, f)]
    assert any("max_model_len 4096 is above the model's n_positions 1024" in p
               for p in refused), refused
    ok = target("max_model_len=1024")
    assert not any("n_positions" in str(p) for p in problems(
        "llm-one", ok.profile, ok.rendered, facts_for(ok, model=found)))


# == issue 21: trust, round two ================================================================
# Items 1, 5, 6 and 7: a template is code from someone else; what a host says reaches a
# terminal, a CI's XML parser and a browser. Items 2-4: a role is someone else's too and
# the agent writes as root. Items 9-14: SSH host keys, bounded reads on hosts, the
# inventory's YAML, names and addresses. Each test replays one attack of the issue.

_CLEAN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
HOSTILE = ("journal \x1b]0;owned\x07 \x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07 \x9b31m \x07\x08 "
           "a\rb \u2028\u2029\x85 \u202e \x00 \udc80 [/INST] [link=file:///etc/shadow]x[/link]")


def _role(tmp_path: Path, text: str, name: str = "evil") -> Any:
    from vigil.desired.roles import load_role

    folder = tmp_path / "roles" / name
    (folder / "templates").mkdir(parents=True)
    (folder / "templates" / "x.conf.j2").write_text(text)
    (folder / "role.yml").write_text(
        "files:\n  - template: x.conf.j2\n    dest: /etc/vigil/evil/x.conf\n")
    return load_role(tmp_path / "roles", name)


def _render_role(tmp_path: Path, text: str) -> str:
    from vigil.desired.roles import render_role

    return render_role(_role(tmp_path, text), "h1", {}).files[0].content


# -- 1. templates render in Jinja's sandbox, bounded in time and size ---------------------


def test_i21_1_a_role_template_cannot_run_a_command_through_python_internals(
        tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    text = f"ok\n{{{{ cycler.__init__.__globals__.os.popen('touch {mark}').read() }}}}\n"
    with pytest.raises(TemplateError, match=r"x\.conf\.j2: line 2: access to attribute "
                                            r"'__init__' of 'type' object is unsafe") as exc:
        _render_role(tmp_path, text)
    assert not mark.exists()
    assert "Traceback" not in str(exc.value) and exc.value.fix


def test_i21_1_a_service_template_renders_in_the_same_sandbox(tmp_path: Path) -> None:
    import shutil

    from tests.unit.test_render_flags import _host, _profile
    from vigil.desired.render import TEMPLATES, render

    shutil.copytree(TEMPLATES, tmp_path / "t")
    (tmp_path / "t" / "vllm.service.j2").write_text(
        "[Unit]\n{{ ''.__class__.__mro__[1].__subclasses__() }}\n")
    with pytest.raises(TemplateError, match=r"vllm\.service\.j2: line 2: .*unsafe"):
        render("h", _host(), _profile(), _stack(), {}, tmp_path / "t")


def _stack() -> Any:
    from vigil.desired import inventory

    return inventory.load(REPO / "inventory").stack("lab-cpu")


def test_i21_1_a_huge_range_fails_at_once_with_one_error(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(TemplateError, match=r"x\.conf\.j2: line 3: OverflowError: Range too "
                                            r"big"):
        _render_role(tmp_path, "a\nb\n{{ range(10**9)|list }}\n")
    assert time.monotonic() - started < 2


def test_i21_1_loops_that_print_nothing_stop_at_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.desired import sandbox

    monkeypatch.setattr(sandbox, "MAX_SECONDS", 0.3)
    text = ("{% set r = range(100000)|list %}\n"
            "{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}"
            "{% endfor %}\n")
    started = time.monotonic()
    with pytest.raises(TemplateError, match=r"line 2: rendering took longer than 0\.3 s"):
        _render_role(tmp_path, text)
    assert time.monotonic() - started < 3


def test_i21_1_exponential_macro_recursion_stops_at_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.desired import sandbox

    monkeypatch.setattr(sandbox, "MAX_SECONDS", 0.3)
    text = ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
            "{{ f(60) }}")
    with pytest.raises(TemplateError, match=r"longer than 0\.3 s"):
        _render_role(tmp_path, text)


@pytest.mark.parametrize("text", [
    "{{ 'x' * 10**9 }}",
    "{{ 2 ** (10 ** 8) }}",
    "{{ 'x'|center(10**10) }}",
    "{{ 'x'.ljust(10**10) }}",
    "{{ 'x'|indent(10**9) }}",
    "{{ '%0999999999d'|format(1) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:999999999}'.format(1) }}",
    "{% set a = 'x' * 1000 %}{{ a|replace('x', a)|replace('x', a) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "{% set s = 'x' * 1000000 %}{% set t %}{{ s }}{{ s }}{% endset %}",
    "{{ range(100000)|map('center', 100000)|join }}",
    "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
    "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}{% endmacro %}"
    "{{ m()|length }}",
    # constant text in a buffered loop counts at each step (never folded at compile time)
    "{% macro m() %}{% for a in range(100000) %}{% for b in range(100000) %}" + "K" * 1000
    + "{% endfor %}{% endfor %}{% endmacro %}{{ m()|length }}",
    "{{ 'x'|center(10000000000) }}",  # a constant Jinja would fold while compiling
])
def test_i21_1_no_template_makes_a_value_or_an_output_past_the_size_cap(
        tmp_path: Path, text: str) -> None:
    started = time.monotonic()
    with pytest.raises(TemplateError, match=r"x\.conf\.j2: .*(over the limit|limit of)"):
        _render_role(tmp_path, text)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(("text", "said"), [
    ("a\n{{ 1/0 }}\n", r"line 2: ZeroDivisionError: division by zero"),
    ("a\n\n{% include 'nowhere.j2' %}\n", r"line 3: includes 'nowhere\.j2', which is not "),
    ("a\n{% for %}\n", r"line 2: Expected an expression"),
    ("{{ nope }}\n", r"line 1: 'nope' is undefined"),
    ("a\n{{ 'port ' + 8080 }}\n", r"line 2: TypeError: can only concatenate str"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", r"line 1: RecursionError: "),
    ("{% include 'x.conf.j2' %}", r"line 1: RecursionError: "),
])
def test_i21_1_every_template_error_is_one_message_with_file_and_line(
        tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(TemplateError, match=r"^\S*/evil/templates/x\.conf\.j2: " + said) as exc:
        _render_role(tmp_path, text)
    assert "Traceback" not in str(exc.value)


def test_i21_1_an_error_in_an_included_template_names_that_file(tmp_path: Path) -> None:
    role = _role(tmp_path, "top\n{% include 'part.j2' %}\n")
    (role.dir / "templates" / "part.j2").write_text("one\ntwo {{ 1 // 0 }}\n")
    from vigil.desired.roles import render_role

    with pytest.raises(TemplateError, match=r"/part\.j2: line 2: ZeroDivisionError"):
        render_role(role, "h1", {})


def test_i21_1_an_ordinary_template_still_renders_with_loops_macros_and_filters(
        tmp_path: Path) -> None:
    text = ("{% macro kv(k, v) %}{{ k }}={{ v|upper }}{% endmacro %}"
            "{% for k, v in {'a': 'b', 'c': 'd'}.items() %}{{ kv(k, v) }}"
            "{{ ',' if not loop.last }}{% endfor %}\n"
            "{% set block %}{{ inventory_hostname ~ '!' }}{% endset %}{{ block|indent(2) }}\n"
            "{{ '%s-%d' % ('p', 3) }} {{ '{}:{}'.format('h', 80) }} {{ [3, 1]|sort|join(' ') }}"
            " {{ 'a b'|replace(' ', '_') }} {{ 'x'|center(5) }}|{{ 2 ** 10 }}\n")
    assert _render_role(tmp_path, text) == "a=B,c=D\nh1!\np-3 h:80 1 3 a_b   x  |1024\n"


# -- 5. text from a host cannot drive the terminal ----------------------------------------------


def test_i21_5_the_neutraliser_shows_control_characters_escaped_and_keeps_text_readable() -> None:
    from vigil.report import safe_text

    assert safe_text("\x1b]0;owned\x07\x1b[2J") == "\\x1b]0;owned\\x07\\x1b[2J"
    assert safe_text("\x1b]52;c;aGk=\x07") == "\\x1b]52;c;aGk=\\x07"
    assert safe_text("a\u2028b\u2029c\x85d\x9be") == "a\\u2028b\\u2029c\\x85d\\x9be"
    assert safe_text("spin\rner\r\nnext") == "spin\\rner\nnext"
    assert safe_text("\u202etxt.exe \u200b \udc80") == "\\u202etxt.exe \\u200b \\udc80"
    kept = "INFO 12:00 loading\tshard 1/4\nmodèle 日本語 ✓ \u00a0 e\u0301 \\x1b as typed"
    assert safe_text(kept) == kept


def test_i21_5_log_lines_from_a_host_reach_the_terminal_cleaned() -> None:
    import io

    from vigil.report import Log

    out = io.StringIO()
    log = Log(out)
    log("lab2", HOSTILE)
    log.block("diff\n" + HOSTILE)
    text = out.getvalue()
    assert not _CLEAN.search(text.replace("\n", "").replace("\t", ""))
    assert "\\x1b]0;owned\\x07" in text and "\\x1b[2J" in text and "\\u2028" in text
    assert len(text.splitlines()) == 3  # a line separator inside a line starts no new line


def test_i21_5_status_preflight_and_error_output_of_the_tasks_is_cleaned(
        capsys: pytest.CaptureFixture[str]) -> None:
    from invoke.exceptions import Exit

    from vigil.deploy.service import HostRun
    from vigil.errors import CommandError
    from vigil.tasks import deploy as deploy_tasks
    from vigil.tasks.common import user_errors

    deploy_tasks._report([HostRun("lab2", value=f"active {HOSTILE}")])
    with pytest.raises(Exit), user_errors():
        raise CommandError("lab2", "hook", 1, f"stderr {HOSTILE}")
    seen = capsys.readouterr()
    for text in (seen.out, seen.err):
        assert "\\x1b]0;owned" in text
        assert not _CLEAN.search(text.replace("\n", "").replace("\t", ""))


def test_i21_5_no_task_prints_around_the_neutraliser() -> None:
    # every print of the host-facing tasks goes through report.echo (safe_text)
    tasks = REPO / "vigil" / "tasks"
    for name in ("common", "deploy", "group", "runtime", "verify"):
        source = (tasks / f"{name}.py").read_text()
        assert not re.search(r"(?<![\w.])print\(", source), name
        assert "echo(" in source, name


def test_i21_5_verify_plain_lines_are_cleaned() -> None:
    import dataclasses
    import io

    from tests.doubles import outcome
    from vigil.verify import report as verify_report
    from vigil.verify.budgets import Budgets

    o = outcome("lab-cold-ready.jsonl")
    assert o.state is not None
    state = dataclasses.replace(o.state, summary=HOSTILE)
    out = io.StringIO()
    rep = verify_report.Reporter(out, live=False)
    rep.note("lab5", HOSTILE)
    rep.poll("lab5", state, _any_snapshot(), Budgets())
    assert "\\x1b[2J" in out.getvalue()
    assert not _CLEAN.search(out.getvalue().replace("\n", ""))


def _any_snapshot() -> Any:
    from vigil.verify import replay

    return replay.load(TRACES
                       / "lab-cold-ready.jsonl")[1][-1]


@given(st.text())
@settings(max_examples=400, deadline=None)
def test_i21_5_any_string_comes_out_printable_and_cleaning_it_again_changes_nothing(
        text: str) -> None:
    import unicodedata

    from vigil.report import safe_text

    clean = safe_text(text)
    assert all(c.isprintable() or c in "\t\n" or unicodedata.category(c) == "Zs"
               for c in clean), ascii(clean)
    assert safe_text(clean) == clean
    clean.encode("utf-8")  # never a lone surrogate
    if not _CLEAN.search(text) and "\r" not in text and text.isascii():
        assert clean == text  # plain text is left as it was


# -- 6. rich markup in host text is shown, never interpreted ------------------------------------


def test_i21_6_markup_in_host_text_neither_crashes_nor_styles_the_live_view() -> None:
    import dataclasses
    import io

    from tests.doubles import outcome
    from vigil.verify import report as verify_report
    from vigil.verify.budgets import Budgets

    o = outcome("lab-cold-ready.jsonl")
    assert o.state is not None
    state = dataclasses.replace(o.state, summary="prompt [/INST] [link=file:///x]y[/link] "
                                                 "[bold red]z :smile:")
    out = io.StringIO()
    with verify_report.Reporter(out, live=True) as rep:
        rep.note("lab5", "said [/INST] and [link=http://evil]click[/link]")
        rep.poll("lab[/b]5", state, _any_snapshot(), Budgets())
    text = out.getvalue()
    assert "said [/INST] and [link=http://evil]click[/link]" in text
    assert "[bold red]z" in text and ":smile:" in text and "lab[/b]5" in text


# -- 7. every report writer accepts any string ------------------------------------------------


def _rollout_with(error: str) -> Any:
    from vigil.deploy import rollout
    from vigil.report import HostResult

    failed = HostResult("h2", "failed", error=error, verdict="crashed", seconds=1.0)
    ok = HostResult("h1", "changed", actions=[f"restart: {error}"], seconds=2.0)
    return rollout.Rollout(serial="1", budget="0", untouched=["h3"],
                           batches=[rollout.BatchResult(1, ["h1", "h2"], [ok, failed])],
                           rolled_back=[HostResult("h2", "failed", error=error)])


def test_i21_7_junit_of_verify_and_of_the_rollout_is_valid_xml_with_control_characters(
        tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    from vigil.deploy import rollout
    from vigil.verify import report as verify_report
    from vigil.verify.watch import Outcome

    lost = Outcome("lab7", error=HOSTILE, exit_code=1)
    empty = Outcome("lab8", error="", exit_code=1)  # an empty message is no IndexError
    path = tmp_path / "verify.xml"
    verify_report.write_junit(str(path), [lost, empty])
    err = ET.parse(path).getroot().find(".//error")
    assert err is not None and "\\x1b]0;owned\\x07" in (err.text or "")
    rpath = tmp_path / "rollout.xml"
    rollout.write_junit(str(rpath), _rollout_with(HOSTILE))
    failure = ET.parse(rpath).getroot().find(".//failure")
    assert failure is not None and "\\u2028" in (failure.text or "")


def test_i21_7_verify_html_reads_a_trace_with_line_separators_after_the_verdict(
        tmp_path: Path) -> None:
    import dataclasses

    from tests.doubles import outcome
    from vigil.verify import html as verify_html
    from vigil.verify.snapshot import Journal, LogLine

    o = outcome("lab-cold-ready.jsonl")
    last = _any_snapshot()
    odd = last.model_copy(update={"time": last.time + 1, "journal": Journal(lines=(
        LogLine(us=int(last.time * 1e6) + 1, text="after\u2028the\x85verdict \x1b[2J"),))})
    trace = tmp_path / "trace.jsonl"
    trace.write_text(Path(o.trace or "").read_text() + odd.to_json() + "\n", encoding="utf-8")
    page = verify_html.outcomes_page([dataclasses.replace(o, trace=str(trace), error=HOSTILE)])
    verify_html.write(str(tmp_path / "page.html"), page)
    assert "\\x1b]0;owned\\x07" in page and not _CLEAN.search(page.replace("\n", ""))


@given(st.text())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_i21_7_any_string_makes_valid_junit_html_and_json(text: str) -> None:
    import json
    import tempfile
    import xml.etree.ElementTree as ET

    from vigil.deploy import rollout, rollout_html
    from vigil.report import safe_text, write_json
    from vigil.verify import html as verify_html
    from vigil.verify import report as verify_report
    from vigil.verify.watch import Outcome

    o = Outcome(text or "h", error=text, exit_code=1)
    case = ET.fromstring(verify_report.junit_xml([o])).find(".//testcase")
    assert case is not None and case.get("name") == safe_text(text or "h")
    error = case.find("error")
    assert error is not None and (error.text or "") == safe_text(text)
    ET.fromstring(rollout.junit_xml(_rollout_with(text)))
    with tempfile.TemporaryDirectory() as tmp:
        verify_html.write(f"{tmp}/v.html", verify_html.outcomes_page([o]))
        rollout_html.write_html(f"{tmp}/r.html", _rollout_with(text))
        write_json(f"{tmp}/r.json", rollout.rollout_json(_rollout_with(text)))
        assert json.loads(Path(f"{tmp}/r.json").read_text())["failed"] == ["h2"]
        for page in ("v.html", "r.html"):
            assert not _CLEAN.search(Path(f"{tmp}/{page}").read_text().replace("\n", ""))


@given(st.text())
@settings(max_examples=150, deadline=None)
def test_i21_7_any_string_makes_one_clean_annotation_and_table_row_for_a_pipeline(
        text: str) -> None:
    import tempfile

    from vigil.report import HostResult
    from vigil.tasks import pipeline

    rows = pipeline.deploy_rows([HostResult(f"h{text}", "failed", error=f"e{text}")])
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": f"{tmp}/summary.md"}
        printed = pipeline.report("deploy", rows, env)
        table = Path(f"{tmp}/summary.md").read_text(encoding="utf-8")
    assert printed.count("\n") == 0 and printed.startswith("::error title=")
    assert not _CLEAN.search(printed)
    row = table.splitlines()[4]
    assert row.startswith("| h") and not _CLEAN.search(table.replace("\n", ""))


# -- 2. a role's files stay in its own folders, its units are the ones it places ---------------


def _spec_role(tmp_path: Path, spec: str, name: str = "evil", allow: str | None = None) -> Any:
    from vigil.desired.roles import load_all

    folder = tmp_path / "roles" / name
    (folder / "templates").mkdir(parents=True, exist_ok=True)
    (folder / "templates" / "t.j2").write_text("x\n")
    (folder / "role.yml").write_text(spec)
    if allow is not None:
        (tmp_path / "roles" / "allow.yml").write_text(allow)
    return load_all(tmp_path / "roles")[name]


@pytest.mark.parametrize("spec, key, value", [
    ("files: [{template: t.j2, dest: /etc/shadow}]", "files.0.dest", "/etc/shadow"),
    ("files: [{template: t.j2, dest: /root/.ssh/authorized_keys}]", "files.0.dest",
     "/root/.ssh/authorized_keys"),
    ("files: [{template: t.j2, dest: /etc/vigil/vllm.env}]", "files.0.dest",
     "/etc/vigil/vllm.env"),
    ("files: [{template: t.j2, dest: /etc/vigil/other/x.conf}]", "files.0.dest",
     "/etc/vigil/other/x.conf"),
    ("files: [{template: t.j2, dest: /var/lib/vigil/backup/vllm/role-files.json}]",
     "files.0.dest", "/var/lib/vigil/backup/vllm/role-files.json"),
    ("files: [{template: t.j2, dest: /etc/systemd/system/sshd.service}]", "files.0.dest",
     "/etc/systemd/system/sshd.service"),
    ("files: [{template: t.j2, dest: /etc/systemd/system/sshd.service.d/evil.conf}]",
     "files.0.dest", "/etc/systemd/system/sshd.service.d/evil.conf"),
    ("files: [{template: t.j2, dest: /etc/systemd/system/multi-user.target.wants/"
     "evil.service}]", "files.0.dest", "multi-user.target.wants/evil.service"),
    ("files: [{template: t.j2, dest: /etc/vigil/evil/x.conf, restart: sshd.service}]",
     "files.0.restart", "sshd.service"),
    ("enable: [poweroff.target]", "enable.0", "poweroff.target"),
])
def test_i21_2_a_role_placing_host_files_or_touching_other_units_is_refused_at_load(
        tmp_path: Path, spec: str, key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        _spec_role(tmp_path, spec + "\n")
    text = str(err.value)
    assert "roles/evil/role.yml" in text and key in text and value in text
    assert "fix:" in text and "allow.yml" in text


def test_i21_2_the_issues_role_is_refused_whole_shadow_sshd_and_poweroff(tmp_path: Path) -> None:
    """The issue's role: /etc/shadow placed, sshd restarted, poweroff.target enabled."""
    with pytest.raises(ConfigError, match=re.escape("files.0.dest: '/etc/shadow'")):
        _spec_role(tmp_path, "files: [{template: t.j2, dest: /etc/shadow, restart: "
                   "sshd.service}]\nenable: [poweroff.target]\n")


def test_i21_2_a_role_named_like_a_folder_vigil_keeps_cannot_write_there(tmp_path: Path) -> None:
    # /opt/vigil/bin/uv is the uv the agent runs as root; /opt/vigil/envs the environments
    with pytest.raises(ConfigError, match="a folder vigil keeps itself"):
        _spec_role(tmp_path, "files: [{template: t.j2, dest: /opt/vigil/bin/uv}]\n", "bin")
    with pytest.raises(ConfigError, match="a folder vigil keeps itself"):
        _spec_role(tmp_path, "files: [{template: t.j2, dest: /opt/vigil/envs/current/x}]\n",
                   "envs")


def test_i21_2_own_folders_own_units_and_their_instances_are_accepted(tmp_path: Path) -> None:
    role = _spec_role(tmp_path, (
        "files:\n"
        "  - {template: t.j2, dest: /etc/vigil/mine/a.conf, restart: vigil-mine@1.service}\n"
        "  - {template: t.j2, dest: /opt/vigil/mine/check.py}\n"
        "  - {template: t.j2, dest: /var/lib/vigil/roles/mine/state}\n"
        "  - {template: t.j2, dest: /etc/systemd/system/vigil-mine@.service}\n"
        "  - {template: t.j2, dest: /etc/systemd/system/mine-exporter.service}\n"
        "  - {template: t.j2, dest: /etc/systemd/system/mine-exporter.service.d/x.conf}\n"
        "enable: [mine-exporter.service, vigil-mine@2.service]\n"), "mine")
    assert len(role.spec.files) == 6 and role.spec.enable[0] == "mine-exporter.service"
    # a unit named for the role but not placed by it is still not its to restart
    with pytest.raises(ConfigError, match=re.escape("enable.0: 'mine-other.service'")):
        _spec_role(tmp_path, "enable: [mine-other.service]\n", "mine")


def test_i21_2_the_ops_repos_allow_list_opens_named_paths_and_units_for_one_role(
        tmp_path: Path) -> None:
    spec = ("files:\n  - {template: t.j2, dest: /etc/nginx/conf.d/mine.conf, "
            "restart: nginx.service}\n  - {template: t.j2, dest: /etc/default/mine}\n")
    with pytest.raises(ConfigError, match="outside the role's own folders"):
        _spec_role(tmp_path, spec, "mine")
    allow = "mine:\n  paths: [/etc/nginx/conf.d/, /etc/default/mine]\n  units: [nginx.service]\n"
    role = _spec_role(tmp_path, spec, "mine", allow)
    assert [f.restart for f in role.spec.files] == ["nginx.service", None]
    # the list is per role: another role gets nothing from it
    with pytest.raises(ConfigError, match="outside the role's own folders"):
        _spec_role(tmp_path, spec.replace("mine.conf", "o.conf"), "other", allow)
    # a folder entry opens what is under it, not a sibling with the same prefix
    with pytest.raises(ConfigError, match=re.escape("files.0.dest: '/etc/nginx/conf.d-evil/x'")):
        _spec_role(tmp_path, "files: [{template: t.j2, dest: /etc/nginx/conf.d-evil/x}]\n",
                   "mine", allow)
    with pytest.raises(ConfigError, match=re.escape("allow.yml: mine: paths: '/etc/../root/'")):
        _spec_role(tmp_path, spec, "mine", "mine: {paths: [/etc/../root/]}\n")


def test_i21_2_the_shipped_health_log_role_still_loads_confined() -> None:
    from tests.paths import REPO
    from vigil.desired.roles import load_all

    role = load_all(REPO / "roles")["health-log"]
    assert role.spec.enable == ["vigil-health-log.timer"]


# -- 13. a trailing newline passes no name check ------------------------------------------------


@pytest.mark.parametrize("key, value", [
    ("service", "vllm\n"), ("service_user", "vllm\n"), ("address", "h1\n"),
    ("env", {"A\n": "1"}), ("env", {"A": "1\n"}), ("secret_env", ["TOKEN\n"]),
    ("host_key_fingerprints", ["SHA256:" + "A" * 43 + "\n"]), ("config_dir", "/etc/vigil\n"),
])
def test_i21_13_a_trailing_newline_is_refused_in_every_host_name_check(
        key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        HostVars.model_validate({key: value})


def test_i21_13_a_trailing_newline_in_a_host_role_or_variable_name_is_refused(
        tmp_path: Path) -> None:
    from vigil.desired import inventory
    from vigil.desired.config import check_name
    from vigil.desired.roles import check_name as role_name
    from vigil.desired.roles import check_value, load_role

    with pytest.raises(ValueError, match="must be 1-100 letters"):
        check_name("host", "h1\n")
    with pytest.raises(ConfigError, match="is not valid"):
        role_name("health-log\n", "hosts.yml")
    with pytest.raises(ConfigError, match="control character"):
        check_value("x", "5min\n", "1min", "hosts.yml")
    inv = _inventory(tmp_path, "hosts:\n  \"h1\\n\": {model: tiny-cpu}\n")
    with pytest.raises(ConfigError, match="must be 1-100 letters"):
        inventory.load(inv)
    (tmp_path / "roles" / "mine").mkdir(parents=True)
    (tmp_path / "roles" / "mine" / "defaults.yml").write_text("\"mine_x\\n\": 1\n")
    with pytest.raises(ConfigError, match="variable name 'mine_x\\\\n' is not valid"):
        load_role(tmp_path / "roles", "mine")


def test_i21_13_the_agent_takes_no_env_link_or_module_name_with_a_trailing_newline(
        tmp_path: Path) -> None:
    from tests.agent_payload import agent

    paths = _paths(tmp_path)
    Path(paths["current"]).symlink_to(paths["env_dir"] + "-r1\n")
    assert agent.env_in_use(paths) == paths["env_dir"]  # not the "-r1\n" one
    Path(paths["current"]).unlink()
    Path(paths["current"]).symlink_to(paths["env_dir"] + "-r1")
    assert agent.env_in_use(paths) == paths["env_dir"] + "-r1"
    errors = agent.import_errors("/nonexistent/python", ["json\n"])
    assert "not a module name" in str(errors.get("json\n"))


# -- 14. an address is a host name or an IP: no user, no port, not empty ------------------------


@pytest.mark.parametrize("address, why", [
    ("evil@127.0.0.1", "holds a user"), ("127.0.0.1:22419", "a port or brackets"),
    ("", "must not be empty"), ("[::1]", "a port or brackets"), ("-oProxyCommand=x",
                                                                   "is not a host name"),
    ("a b", "is not a host name"),
])
def test_i21_14_a_bad_address_is_one_error_naming_the_file_and_the_key(
        tmp_path: Path, address: str, why: str) -> None:
    from tests.doubles import target_in

    with pytest.raises(ConfigError) as err:
        target_in(tmp_path, f"hosts:\n  h1: {{model: tiny-cpu, address: '{address}'}}\n", "h1")
    text = str(err.value)
    assert "hosts.yml" in text and "address" in text and why in text
    assert "ssh_user" in text and "ssh_port" in text  # the fix: where user and port go


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "fe80::1", "gpu-01.example.com",
                                     "lab1", "10.0.0.7"])
def test_i21_14_host_names_and_ips_are_still_addresses(address: str) -> None:
    assert HostVars.model_validate({"address": address}).address == address


# -- 3. --check shows the host's side of a diff only for files vigil wrote ---------------------


def _file_role(dest: Path, content: str = "new=1\n") -> Any:
    from vigil.desired.roles import RenderedFile, RenderedRole

    return RenderedRole("mine", (RenderedFile("mine", str(dest), content, "644", "root", None),),
                        ())


def _check_diff(role: Any) -> tuple[Any, str]:
    from tests.agent_payload import agent
    from vigil.deploy.roles import parse_role_facts, plan_roles, request

    facts = agent.role_facts(request((role,)))
    (write,) = [a for a in plan_roles((role,), parse_role_facts(facts)) if a.kind == "write_file"]
    return facts["files"][role.files[0].dest], write.diff


SHADOW = "root:$6$rounds=5000$c2FsdA$SECRETHASHSECRETHASH:19000:0:99999:7:::\n"


@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_i21_3_a_host_file_vigil_did_not_write_is_shown_by_name_and_hash_only(
        tmp_path: Path, mode: int) -> None:
    import hashlib

    dest = tmp_path / "etc" / "shadow"
    dest.parent.mkdir()
    dest.write_text(SHADOW)
    dest.chmod(mode)
    state, diff = _check_diff(_file_role(dest))
    assert state["text"] is None and state["vigil"] is False
    assert "SECRETHASH" not in diff and "$6$" not in diff
    assert hashlib.sha256(SHADOW.encode()).hexdigest() in diff and "not shown" in diff
    assert "+new=1\n" in diff  # what vigil would write is still shown


def _linked_to_shadow(tmp_path: Path) -> tuple[Path, Path]:
    """A root-only secret file, and a role destination that is a symlink to it."""
    secret = tmp_path / "shadow"
    secret.write_text(SHADOW)
    secret.chmod(0o600)
    dest = tmp_path / "etc" / "x.conf"
    dest.parent.mkdir()
    dest.symlink_to(secret)
    return secret, dest


def test_i21_3_a_symlink_at_the_destination_is_never_followed(tmp_path: Path) -> None:
    from tests.agent_payload import agent

    secret, dest = _linked_to_shadow(tmp_path)
    state, diff = _check_diff(_file_role(dest))
    assert state["kind"] == "a symlink" and "sha256" not in state and state["text"] is None
    assert "SECRETHASH" not in diff and "a symlink" in diff
    # the write replaces the link itself, the file it pointed at is untouched
    agent.write_atomic(str(dest), "new=1\n", 0o644)
    assert not dest.is_symlink() and dest.read_text() == "new=1\n"
    assert secret.read_text() == SHADOW


def test_i21_3_a_file_vigil_wrote_or_marked_keeps_its_diff(tmp_path: Path) -> None:
    from tests.agent_payload import agent
    from vigil.desired.render import BANNER

    assert agent.MANAGED_MARKER == BANNER
    dest = tmp_path / "etc" / "mine.conf"
    reply = agent.apply({"paths": {}, "actions": [
        {"kind": "write_file", "path": str(dest), "content": "old=1\n", "mode": "600",
         "owner": "root"}]})
    assert reply["results"][0]["ok"], reply
    state, diff = _check_diff(_file_role(dest))  # 0600, but its hash was recorded
    assert state["vigil"] is True and "-old=1\n" in diff and "+new=1\n" in diff
    # someone edits it on the host: no longer what vigil wrote, so no longer shown
    dest.write_text("old=1\npassword=hunter2\n")
    state, diff = _check_diff(_file_role(dest))
    assert state["text"] is None and "hunter2" not in diff
    # vigil's banner marks a world-readable file as vigil's, never a private one
    dest.write_text(f"# {BANNER}\nold=2\n")
    dest.chmod(0o644)
    assert "-old=2\n" in _check_diff(_file_role(dest))[1]
    dest.chmod(0o600)
    assert "old=2" not in _check_diff(_file_role(dest))[1]


def test_i21_3_an_unchanged_file_vigil_did_not_write_plans_nothing(tmp_path: Path) -> None:
    from tests.agent_payload import agent
    from vigil.deploy.roles import parse_role_facts, plan_roles, request

    dest = tmp_path / "etc" / "same.conf"
    dest.parent.mkdir()
    dest.write_text("new=1\n")
    dest.chmod(0o644)
    role = _file_role(dest)
    facts = agent.role_facts(request((role,)))
    assert facts["files"][str(dest)]["text"] is None  # compared by its hash
    assert plan_roles((role,), parse_role_facts(facts)) == []


# -- 4. the agent's writes do not follow another user's symlinks; it cleans only its temps ------


def _other_users_link(tmp_path: Path) -> tuple[Path, Path]:
    import os

    target = tmp_path / "victim"
    target.mkdir()
    (target / "authorized_keys").write_text("ssh-ed25519 AAAA the-real-key\n")
    link = tmp_path / "etc" / "mine"
    link.parent.mkdir()
    link.symlink_to(target)
    os.lchown(link, 65534, 65534)  # planted by `nobody`
    return link, target


def test_i21_4_a_write_through_a_parent_symlink_another_user_owns_is_refused(
        tmp_path: Path) -> None:
    from tests.agent_payload import agent

    link, target = _other_users_link(tmp_path)
    with pytest.raises(OSError, match="a symlink owned by uid 65534"):
        agent.write_atomic(str(link / "authorized_keys"), "ssh-ed25519 AAAA evil\n", 0o600)
    (res,) = agent.apply({"paths": {}, "actions": [
        {"kind": "write_file", "path": str(link / "authorized_keys"), "content": "evil\n",
         "mode": "600", "owner": "root"}]})["results"]
    assert res["ok"] is False and str(link) in res["error"] and "uid 65534" in res["error"]
    assert (target / "authorized_keys").read_text() == "ssh-ed25519 AAAA the-real-key\n"
    assert sorted(p.name for p in target.iterdir()) == ["authorized_keys"]
    # reading through it is refused the same way: no text, no hash
    state = agent.file_state(str(link / "authorized_keys"))
    assert state["kind"] == "refused" and "sha256" not in state and "uid 65534" in state["error"]


def test_i21_4_a_symlink_root_owns_is_followed_as_before(tmp_path: Path) -> None:
    from tests.agent_payload import agent

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "run").symlink_to("real")  # like /var/run -> ../run, owned by root
    agent.write_atomic(str(tmp_path / "run" / "a" / "x.conf"), "x\n", 0o644)
    assert (real / "a" / "x.conf").read_text() == "x\n"


def test_i21_4_temp_cleanup_removes_only_vigils_own_temp_names(tmp_path: Path) -> None:
    import os
    import time as time_mod

    from tests.agent_payload import agent

    old = time_mod.time() - 3600
    others = [".vigil-settings", ".vigil-12345678", "app.vigil-42", ".vigil-tmp-0123",
              ".vigil-tmp-0123456789abcdefX", "x.vigil-tmp-0123456789abcdef"]
    for name in others:
        (tmp_path / name).write_text("someone else's\n")
    mine = tmp_path / ".vigil-tmp-0123456789abcdef"
    mine.write_text("half a file\n")
    foreign = tmp_path / ".vigil-tmp-aaaaaaaaaaaaaaaa"  # vigil's shape, another user's file
    foreign.write_text("not ours\n")
    os.chown(foreign, 65534, 65534)
    folder = tmp_path / ".vigil-tmp-bbbbbbbbbbbbbbbb"
    folder.mkdir()
    for p in tmp_path.iterdir():
        os.utime(p, (old, old))
    agent.write_atomic(str(tmp_path / "unit.service"), "[Unit]\n", 0o644)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*others, foreign.name, folder.name, "unit.service"])
    assert agent.TEMP_NAME.match(agent.temp_name())


def test_i21_4_a_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    from tests.agent_payload import agent

    with pytest.raises(UnicodeEncodeError):
        agent.write_atomic(str(tmp_path / "x.conf"), "a lone surrogate \udc80\n", 0o644)
    assert list(tmp_path.iterdir()) == []


# -- 11. the agent reads a model's files bounded: regular files, a size cap, a depth cap ---------


def _model_dir(tmp_path: Path) -> Path:
    import json
    import struct

    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 128,
                                               "num_attention_heads": 2}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    (d / "tokenizer.json").write_text("{}")
    return d


def _facts_within(path: Path, seconds: float = 20.0) -> Any:
    """model_facts in a thread: a read that blocks (a FIFO) fails the test, not the run."""
    import threading

    from tests.agent_payload import agent

    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(agent.model_facts(str(path))),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"model_facts({path}) still running after {seconds} s"
    return out[0]


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_i21_11_a_model_file_that_is_a_device_or_a_fifo_is_one_refusal_naming_it(
        tmp_path: Path, name: str, special: str) -> None:
    import os

    d = _model_dir(tmp_path)
    (d / name).unlink(missing_ok=True)
    if special == "fifo":
        os.mkfifo(d / name)
    else:
        (d / name).symlink_to(special)
    facts = _facts_within(d)
    kind = "a FIFO" if special == "fifo" else "a character device"
    if name == "config.json":
        assert name in facts["config"]["error"] and kind in facts["config"]["error"]
        assert facts["layouts"]["meta"][name] == f"unreadable: {kind}, not a regular file"
    else:
        assert name in facts["weights"]["error"] and kind in facts["weights"]["error"]
        assert facts["layouts"]["meta"][name] == f"unreadable: {kind}, not a regular file"
    assert facts["layouts"]["safetensors"]["model.safetensors"]["error"] is None
    # preflight names it: one line, the file and why
    from vigil.deploy import weights

    problems = weights.problems(weights.parse(facts["layouts"]), ["--tokenizer=x"])
    assert f"{name}: unreadable: {kind}, not a regular file" in problems


def test_i21_11_a_fifo_or_device_among_the_safetensors_and_tokenizer_files_cannot_block(
        tmp_path: Path) -> None:
    import os

    d = _model_dir(tmp_path)
    os.mkfifo(d / "model-00002-of-00002.safetensors")
    (d / "tokenizer.json").unlink()
    os.mkfifo(d / "tokenizer.json")
    (d / "vocab.json").symlink_to("/dev/zero")
    facts = _facts_within(d)
    layout = facts["layouts"]["safetensors"]["model-00002-of-00002.safetensors"]
    assert layout["error"] == "a FIFO, not a regular file"
    assert facts["layouts"]["meta"]["tokenizer.json"] == "unreadable: a FIFO, not a regular file"
    assert facts["layouts"]["meta"]["vocab.json"].startswith("unreadable: a character device")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json",
                                  "tokenizer.json"])
def test_i21_11_json_nested_200k_deep_is_refused_without_aborting_the_facts(
        tmp_path: Path, name: str) -> None:
    d = _model_dir(tmp_path)
    (d / name).write_text("[" * 200_000 + "]" * 200_000)
    facts = _facts_within(d)
    text = str(facts)
    assert "nested deeper than 512 levels" in text and name in text
    assert facts["layouts"]["safetensors"]["model.safetensors"]["error"] is None


def test_i21_11_a_deep_safetensors_header_is_refused_too(tmp_path: Path) -> None:
    import struct

    d = _model_dir(tmp_path)
    header = b'{"w": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    layout = _facts_within(d)["layouts"]["safetensors"]["model.safetensors"]
    assert layout["error"] == "its header is nested deeper than 512 levels"


@pytest.mark.parametrize("offsets", ["[0, 1e400]", "[0, NaN]", "[0, -4]", "[0, true]",
                                     "[0, 4.5]", "[0]", "[0, 1e30]"])
def test_i21_11_bad_data_offsets_are_one_error_naming_the_tensor(
        tmp_path: Path, offsets: str) -> None:
    import struct

    d = _model_dir(tmp_path)
    header = ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": ' + offsets + "}}").encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    layout = _facts_within(d)["layouts"]["safetensors"]["model.safetensors"]
    assert layout["error"] == "its header has a tensor without two whole data_offsets: w"


def test_i21_11_a_model_file_past_the_size_cap_is_refused_by_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.agent_payload import agent

    d = _model_dir(tmp_path)
    (d / "model.safetensors.index.json").write_text('{"weight_map": {}}' + " " * 4096)
    monkeypatch.setattr(agent, "JSON_READ_MAX", 1024)
    facts = _facts_within(d)
    assert "model.safetensors.index.json" in facts["weights"]["error"]
    assert "more than the 1024 read here" in facts["weights"]["error"]


def test_i21_11_the_facts_verb_answers_for_a_hostile_model_dir(tmp_path: Path) -> None:
    """Through the agent's own entry point: one reply, the file named, no agent_error."""
    import json
    import os

    from tests.agent_payload import agent

    d = _model_dir(tmp_path)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    reply = agent.main(["agent", "facts"], json.dumps({
        "paths": _paths(tmp_path), "unit": "vigil-no-such-unit.service", "port": 1,
        "service_user": "root", "model": str(d)}))
    assert "agent_error" not in reply
    assert "config.json" in reply["model"]["config"]["error"]


# -- 12. YAML: no YAML 1.1 numbers, no duplicate keys, no alias bombs ---------------------------


@pytest.mark.parametrize("value, why", [
    ("1:30", "sexagesimal"), ("0x1F90", "hexadecimal"), ("017", "octal"),
    ("0b1010", "binary"), ("8_080", "underscores"), ("1:30.5", "sexagesimal"),
])
def test_i21_12_a_yaml_1_1_number_is_refused_naming_file_and_line(
        tmp_path: Path, value: str, why: str) -> None:
    from tests.doubles import target_in

    with pytest.raises(ConfigError) as err:
        target_in(tmp_path, f"hosts:\n  h1:\n    model: tiny-cpu\n    port: {value}\n", "h1")
    text = str(err.value)
    assert "hosts.yml" in text and "line 4" in text and why in text and repr(value) in text


def test_i21_12_decimal_numbers_and_quoted_text_read_as_before() -> None:
    from vigil.desired.yamlfile import load_yaml

    assert load_yaml("a: 8080\nb: -3\nc: 0\nd: 1.5\ne: '1:30'\nf: .inf\ng: 0x1F90z\n") == {
        "a": 8080, "b": -3, "c": 0, "d": 1.5, "e": "1:30", "f": float("inf"), "g": "0x1F90z"}


def test_i21_12_a_set_flag_takes_no_yaml_1_1_number(tmp_path: Path) -> None:
    from vigil.desired import inventory, targets

    inv = _inventory(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu}\n")
    with pytest.raises(ConfigError, match=r"--set port: the value is not valid YAML .*sexag"):
        targets.resolve(inventory.load(inv), "h1", operator_env={}, sets=["port=1:30"])


@pytest.mark.parametrize("text, line", [
    ("hosts:\n  h1: {model: tiny-cpu}\n  h1: {model: other}\n", 3),
    ("hosts:\n  h1:\n    model: tiny-cpu\n    port: 8000\n    port: 9000\n", 5),
])
def test_i21_12_a_duplicate_key_is_refused_naming_both_lines(
        tmp_path: Path, text: str, line: int) -> None:
    from vigil.desired import inventory

    with pytest.raises(ConfigError) as err:
        inventory.load(_inventory(tmp_path, text))
    assert f"line {line}" in str(err.value) and "duplicate key" in str(err.value)
    assert "first on line" in str(err.value) and "hosts.yml" in str(err.value)


def test_i21_12_a_merge_key_still_overrides_what_it_merges() -> None:
    from vigil.desired.yamlfile import load_yaml

    text = "base: &b {port: 1, model: m}\nh1: {<<: *b, port: 2}\n"
    assert load_yaml(text)["h1"] == {"port": 2, "model": "m"}


def test_i21_12_an_alias_bomb_under_overrides_is_refused_at_once(tmp_path: Path) -> None:
    import time as time_mod

    from vigil.desired import inventory

    levels = ["    a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    text = "hosts:\n  h1:\n   model: tiny-cpu\n   overrides:\n" + "\n".join(
        " " + line for line in levels) + "\n"
    started = time_mod.monotonic()
    with pytest.raises(ConfigError, match="expand to more than 200000 values"):
        inventory.load(_inventory(tmp_path, text))
    assert time_mod.monotonic() - started < 5


def test_i21_12_a_recursive_alias_or_too_many_aliases_is_refused() -> None:
    import yaml

    from vigil.desired.yamlfile import load_yaml

    with pytest.raises(yaml.YAMLError, match="recursive"):
        load_yaml("a: &a [1, *a]\n")
    with pytest.raises(yaml.YAMLError, match="more than 1000 aliases"):
        load_yaml("a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n")


# -- 9, 10. a revoked host key: refused at key exchange, before any login, never recorded -------


class _RecordingSSHServer:
    """A one-connection SSH server on 127.0.0.1 (paramiko's server side) that records
    every authentication request: the host must never see one for a key it should not
    have been trusted with."""

    def __init__(self) -> None:
        import threading

        import paramiko

        self.key = paramiko.ECDSAKey.generate()
        self.auth: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import paramiko

        auth = self.auth

        class Iface(paramiko.ServerInterface):
            def get_allowed_auths(self, username: str) -> str:
                auth.append(f"asked:{username}")
                return "publickey"

            def check_auth_none(self, username: str) -> int:
                auth.append(f"none:{username}")
                return paramiko.AUTH_FAILED

            def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
                auth.append(f"publickey:{username}")
                return paramiko.AUTH_SUCCESSFUL

        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.key)
        try:
            transport.start_server(server=Iface())
            transport.accept(1)
        except (paramiko.SSHException, EOFError, OSError):
            pass
        finally:
            time.sleep(0.2)
            transport.close()

    def known_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.key.get_name()} {self.key.get_base64()}"

    def close(self) -> None:
        self.sock.close()
        self.thread.join(10)


def _client_key(tmp_path: Path) -> str:
    import paramiko

    path = tmp_path / "client_key"
    paramiko.ECDSAKey.generate().write_private_key_file(str(path))
    return str(path)


@pytest.mark.parametrize("also_listed", [False, True])
def test_i21_10_a_revoked_host_key_is_refused_at_key_exchange_before_any_login(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, also_listed: bool) -> None:
    """The key is @revoked in ~/.ssh/known_hosts (and, the worse case, listed as known
    too): the connection ends at key exchange; the server saw no authentication."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    home = fake_home(tmp_path, monkeypatch)
    server = _RecordingSSHServer()
    try:
        lines = [f"@revoked {server.known_line()}"] + ([server.known_line()] if also_listed
                                                       else [])
        (home / ".ssh" / "known_hosts").write_text("\n".join(lines) + "\n")
        hv = HostVars.model_validate({"address": "127.0.0.1", "ssh_port": server.port,
                                      "ssh_user": "root", "ssh_key": _client_key(tmp_path),
                                      "connect_timeout_s": 5})
        t = SSHTransport("h1", hv)
        with pytest.raises(UnreachableError, match="is marked @revoked"):
            t.run("true")
        t.close()
    finally:
        server.close()
    assert server.auth == []


def test_i21_9_accept_new_never_records_a_revoked_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    home = fake_home(tmp_path, monkeypatch)
    server = _RecordingSSHServer()
    inventory_known = tmp_path / "inventory" / "known_hosts"
    notes: list[str] = []
    try:
        (home / ".ssh" / "known_hosts").write_text(f"@revoked {server.known_line()}\n")
        hv = HostVars.model_validate({
            "address": "127.0.0.1", "ssh_port": server.port, "ssh_user": "root",
            "ssh_key": _client_key(tmp_path), "connect_timeout_s": 5,
            "host_key": "accept-new", "known_hosts": str(inventory_known)})
        t = SSHTransport("h1", hv, note=notes.append)
        with pytest.raises(UnreachableError, match="is marked @revoked"):
            t.run("true")
        t.close()
    finally:
        server.close()
    assert inventory_known.read_text() == "" and notes == [] and server.auth == []


def test_i21_9_the_accept_new_policy_checks_revocation_before_writing(tmp_path: Path) -> None:
    import paramiko

    from vigil.transport.hostkeys import _AcceptNew, _KeyRefused

    key = paramiko.ECDSAKey.generate()
    path = tmp_path / "known_hosts"
    path.write_text("")
    policy = _AcceptNew(path, lambda _: None, {key.get_base64()})
    with pytest.raises(_KeyRefused, match="revoked"):
        policy.missing_host_key(paramiko.SSHClient(), "h1", key)
    assert path.read_text() == ""
    load = KnownHosts(revoked={key.get_base64()})
    keys = paramiko.HostKeys()
    load_known_hosts(f"h1 {key.get_name()} {key.get_base64()}\n", keys, path, load)
    assert keys.lookup("h1") is None  # so paramiko asks the policy, at key exchange


def test_i21_4_the_release_backup_keeps_a_symlink_as_a_link_never_the_file_behind_it(
        tmp_path: Path) -> None:
    """A role file's destination that is a symlink to /etc/shadow: the backup keeps the
    link, not shadow's bytes, and a rollback puts the link back."""
    import os

    from tests.agent_payload import agent

    secret, dest = _linked_to_shadow(tmp_path)
    paths = {"unit": str(tmp_path / "u.service"), "env": str(tmp_path / "u.env"),
             "current": str(tmp_path / "current"), "backup_dir": str(tmp_path / "backup")}
    fifo = tmp_path / "etc" / "fifo"
    os.mkfifo(fifo)
    agent.backup_release(paths, [{"path": str(dest), "restart": None},
                                 {"path": str(fifo), "restart": None}])
    kept_bytes = b"".join(p.read_bytes() for p in (tmp_path / "backup").iterdir()
                          if p.name.startswith("file-"))
    assert b"SECRETHASH" not in kept_bytes
    agent.write_atomic(str(dest), "new=1\n", 0o644)
    assert not dest.is_symlink()
    kept = agent.kept_role_files(paths["backup_dir"])
    assert agent.restore_role_files(kept) == [str(dest)]  # the FIFO is left alone
    assert os.readlink(dest) == str(secret) and secret.read_text() == SHADOW
    assert fifo.exists()


# -- 17. an empty --serial is refused; every spelling of loopback is loopback -------------------


@pytest.mark.parametrize("serial", ["", " ", "\t"])
def test_i21_17_an_empty_serial_is_a_usage_error_naming_the_flag_and_the_fix(
        serial: str) -> None:
    from vigil.deploy import rollout

    with pytest.raises(ConfigError) as err:
        rollout.parse_serial(serial)
    assert err.value.exit_code == 2
    assert "--serial" in str(err.value) and "empty" in str(err.value)
    assert "--serial 1" in str(err.value) and "leave the flag out" in str(err.value)
    with pytest.raises(ConfigError, match="--serial"):
        rollout.plan_batches(["h1", "h2", "h3"], serial)
    assert rollout.plan_batches(["h1", "h2"], None) == [["h1", "h2"]]  # no flag: one batch


def test_i21_17_deploy_with_an_empty_serial_exits_2_before_any_host_is_touched(
        tmp_path: Path) -> None:
    """`--serial "$SERIAL"` with the CI variable unset: all hosts at once, no canary."""
    import os
    import sys

    repo = REPO
    inv = linked_inventory(tmp_path, "hosts:\n" + "".join(
        f"  h{i}: {{address: 192.0.2.{i}, model: tiny-cpu, stack: lab-cpu, connect_timeout_s: 1}}\n"
        for i in (1, 2, 3)))
    run = subprocess.run(
        [str(Path(sys.executable).parent / "invoke"), "deploy", "--hosts", "all",
         "--serial", ""], cwd=repo, capture_output=True, text=True, timeout=120,
        env={**os.environ, "INVOKE_VIGIL_INVENTORY": str(inv),
             "INVOKE_VIGIL_STATE_DIR": str(tmp_path / "state")})
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--serial" in run.stderr and "empty" in run.stderr
    assert "192.0.2" not in run.stdout + run.stderr  # no host was dialled


LOOPBACKS = ["127.0.0.1", "LOCALHOST", "localhost.", "Localhost.localdomain", "ip6-localhost",
             "ip6-loopback", "api.localhost", "0.0.0.0", "::", "::1", "[::1]",
             "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "[::ffff:127.0.0.1]", "::1%lo", "127.1",
             "127.0.0.2", "0x7f.0.0.1", "2130706433", " 127.0.0.1 "]


@pytest.mark.parametrize("addr", LOOPBACKS)
def test_i21_17_every_spelling_of_loopback_is_refused_as_a_multi_node_master(
        tmp_path: Path, addr: str) -> None:
    from tests.unit.test_groups import _resolve

    with pytest.raises(ConfigError) as err:
        _resolve(tmp_path, f"head: gpu-a\nworkers: [gpu-b]\nmodel: glm-5-pp2\n"
                 f"master_addr: {addr!r}\n")
    assert "master_addr" in str(err.value) and "loopback" in str(err.value)


@pytest.mark.parametrize("addr", ["10.0.0.11", "192.0.2.7", "gpu-a.example.com", "2001:db8::1",
                                  "[2001:db8::1]", "::ffff:10.0.0.11", "localhost-1",
                                  "mylocalhost", "128.0.0.1", "1"])
def test_i21_17_an_address_of_the_head_is_still_a_master(addr: str) -> None:
    from vigil.desired.groups import is_loopback

    assert not is_loopback(addr)


# -- 18. verify needs only the secret its smoke sends; rollback's smoke sends the same key -------


def _task_ctx(inv: Path) -> Any:
    from invoke.config import Config
    from invoke.context import Context

    from vigil.tasks.project import DEFAULTS

    return Context(Config(overrides={"vigil": {
        **dict.fromkeys(DEFAULTS), "inventory": str(inv), "state_dir": str(inv.parent / "state")}}))


def _run_task(task: str, c: Any, **kwargs: Any) -> int:
    from invoke.exceptions import Exit

    from vigil.tasks.collection import ns

    try:
        ns[task](c, **kwargs)
    except Exit as done:
        return int(done.code)
    return 0


def _secret_inv(tmp_path: Path, secrets: str) -> Path:
    return linked_inventory(tmp_path, f"hosts:\n  h1: {{address: 192.0.2.1, model: tiny-cpu, "
                            f"stack: lab-cpu, secret_env: [{secrets}]}}\n")


def test_i21_18_verify_runs_without_a_deploy_only_secret_and_sends_the_api_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from vigil.verify import watch
    from vigil.verify.watch import Outcome

    seen: list[Target] = []

    def verify_all(targets: list[Target], *args: Any, **kwargs: Any) -> list[Outcome]:
        seen.extend(targets)
        return [Outcome(t.name, error="unreachable here", exit_code=1) for t in targets]

    monkeypatch.setattr(watch, "verify_all", verify_all)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "sk-verify-1")
    inv = _secret_inv(tmp_path, "HF_TOKEN, VLLM_API_KEY")
    assert _run_task("verify", _task_ctx(inv), hosts="h1") == 1  # the host, not the flag
    assert "HF_TOKEN" not in capsys.readouterr().err
    assert [t.name for t in seen] == ["h1"]
    assert seen[0].rendered.env["VLLM_API_KEY"] == "sk-verify-1"  # what the smoke sends
    # the key the smoke sends is still required: a smoke without it is a 401, not a verdict
    monkeypatch.delenv("VLLM_API_KEY")
    seen.clear()
    assert _run_task("verify", _task_ctx(inv), hosts="h1") == 2
    assert "VLLM_API_KEY" in capsys.readouterr().err and not seen


def test_i21_18_group_verify_runs_without_a_deploy_only_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from vigil.tasks import group as group_tasks

    inv = tmp_path / "inventory"
    shutil.copytree(FIXTURES / "golden-groups" / "inventory", inv)
    assert "secret_env: [HF_TOKEN]" in (inv / "hosts.yml").read_text()
    watched: list[Any] = []
    monkeypatch.setattr(group_tasks, "_watch", lambda c, g, log, s: watched.append(g) or 0)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert _run_task("group.verify", _task_ctx(inv), name="glm-native") == 0
    assert [g.spec.name for g in watched] == ["glm-native"]


def test_i21_18_rollback_smoke_sends_the_api_key_of_secret_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import contextmanager

    from vigil.deploy import service
    from vigil.verify import watch

    @contextmanager
    def no_lock(*args: Any) -> Any:
        yield

    sent: list[str | None] = []
    monkeypatch.setattr(service, "deploy_lock", no_lock)
    monkeypatch.setattr(service, "call", lambda *a, **k: {"ok": True, "restored": ["unit"]})
    monkeypatch.setattr(service, "status", lambda *a: type("S", (), {"served_name": "tiny"}))
    monkeypatch.setattr(watch, "watch_service",
                        lambda name, t, target, *a, **k: sent.append(target.api_key))
    monkeypatch.setenv("VLLM_API_KEY", "sk-deploy-1")
    hv = HostVars.model_validate({"address": "192.0.2.1", "secret_env": ["VLLM_API_KEY"]})

    class T:
        name = "h1"

    service.rollback(T(), hv, wait=True, settings=watch.Settings(),  # type: ignore[arg-type]
                     state_dir=Path("/nonexistent"), log=lambda h, m: None)
    assert sent == ["sk-deploy-1"]  # as deploy's and verify's smoke send it
    plain = HostVars.model_validate({"address": "192.0.2.1", "env": {"VLLM_API_KEY": "sk-env"}})
    service.rollback(T(), plain, wait=True, settings=watch.Settings(),  # type: ignore[arg-type]
                     state_dir=Path("/nonexistent"), log=lambda h, m: None)
    assert sent[-1] == "sk-env"
    # in secret_env but not set here: refused before anything is swapped, as deploy refuses
    monkeypatch.delenv("VLLM_API_KEY")
    swapped: list[object] = []
    monkeypatch.setattr(service, "call", lambda *a, **k: swapped.append(a) or {"ok": True})
    with pytest.raises(ConfigError, match="VLLM_API_KEY"):
        service.rollback(T(), hv, wait=True, settings=watch.Settings(),  # type: ignore[arg-type]
                         state_dir=Path("/nonexistent"), log=lambda h, m: None)
    assert swapped == []


# -- 15. history and traces: no record that is not a time or a duration -------------------------

# Each a record of the real key with one field made hostile; parsed by Python's json, which
# reads NaN, Infinity and 1e400 (as inf) without complaint.
_BAD_RECORDS = {
    "started_at": ("started_at", 1e300), "started_at_nan": ("started_at", "NaN"),
    "phase_nan": ("phases_s", {"compiling": "NaN"}), "phase_neg": ("phases_s", {"compiling": -5.0}),
    "quiet_nan": ("quiet_s", {"compiling": "NaN"}), "quiet_huge": ("quiet_s", {"compiling": 1e308}),
    "total_inf": ("total_s", "Infinity"), "total_neg": ("total_s", -1.0),
}


def _hostile_history(good: dict[str, Any]) -> tuple[str, list[str]]:
    """The host's JSONL: the good record, then one hostile line per field; the lines'
    numbers of the hostile ones."""
    import json

    lines = [json.dumps(good)]
    for field, value in _BAD_RECORDS.values():
        rec = json.loads(json.dumps(good))
        if isinstance(value, dict):
            rec[field] = {**rec[field], **value}
        else:
            rec[field] = value
        text = json.dumps(rec).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
        lines.append(text)
    return "\n".join(lines) + "\n", [str(n) for n in range(2, len(lines) + 1)]


def test_i21_15_hostile_history_lines_are_ignored_with_one_warning_each() -> None:
    from tests.doubles import rec
    from vigil.verify import history

    text, bad_lines = _hostile_history(rec(100.0).to_dict())
    records, warnings = history.read_lines(text, "lab5:/var/lib/vigil/history/vllm.jsonl")
    assert records == [rec(100.0)]  # the rest of the history is still used
    assert len(warnings) == len(bad_lines)
    for line, warning in zip(bad_lines, warnings, strict=True):
        assert warning.startswith(f"lab5:/var/lib/vigil/history/vllm.jsonl line {line}: ")
        assert "ignored" in warning and "\n" not in warning
    assert "started_at" in warnings[0] and "1e+300" in warnings[0]
    assert "quiet_s" in warnings[4] and "compiling" in warnings[4] and "nan" in warnings[4]
    assert history.parse_lines(text) == ([rec(100.0)], len(bad_lines))


def test_i21_15_hostile_rows_of_the_mirror_are_ignored_and_history_still_prints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rows an older vigil merged: `invoke history` had died in gmtime(1e300)."""
    import json
    import sqlite3

    from tests.doubles import rec
    from vigil.verify.history import Mirror, record_id

    state = tmp_path / "state"
    mirror = Mirror(state / "history.sqlite")
    mirror.add([rec(100.0)])
    text, _ = _hostile_history(rec(100.0).to_dict())
    with sqlite3.connect(mirror.path) as db:
        for i, line in enumerate(text.splitlines()[1:]):
            db.execute("INSERT INTO records VALUES (?,?,?,?,?,?,?,?)",
                       (f"bad{i}", "lab5", "tiny-cpu", "cpu-2c", "cold", float(i), "ready", line))
    assert mirror.records() == [rec(100.0)]
    assert len(mirror.warnings) == len(_BAD_RECORDS)
    assert all(w.startswith(f"{mirror.path} record bad") and "ignored" in w
               for w in mirror.warnings)
    inv = _secret_inv(tmp_path, "")
    c = _task_ctx(inv)
    assert _run_task("history", c) == 0
    seen = capsys.readouterr()
    assert record_id(rec(100.0)) and "tiny-cpu" in seen.out and "Traceback" not in seen.err
    assert seen.err.count("warning: ") == len(_BAD_RECORDS)
    assert json.dumps(rec(100.0).to_dict())  # the good one is untouched


def test_i21_15_a_nan_quiet_time_in_host_history_cannot_turn_stall_detection_off(
        tmp_path: Path) -> None:
    import math

    from tests.doubles import FakeClock, RecordedHost, lab_trace, target_in
    from vigil.verify import watch

    target = target_in(tmp_path, "hosts:\n  lab5: {address: 127.0.0.1, ssh_port: 2205, "
                       "model: tiny-cpu, stack: lab-cpu}\n", "lab5")
    snaps = lab_trace("lab-cold-ready.jsonl")
    first = RecordedHost(snaps)
    clock = FakeClock()
    watch.verify_target(target, watch.Settings(), tmp_path / "a", transport=first,
                        clock=clock, sleep=clock.sleep)
    import json

    good = json.loads(first.history.splitlines()[0])
    text, bad_lines = _hostile_history(good)
    notes: list[str] = []
    second = RecordedHost(snaps, history_text=text)
    out = watch.verify_target(target, watch.Settings(min_samples=1), tmp_path / "b",
                              transport=second, clock=clock, sleep=clock.sleep,
                              on_note=lambda host, message: notes.append(message))
    assert out.verdict == "ready" and out.plan is not None and out.plan.level == "exact"
    budgets = out.plan.budgets
    assert all(math.isfinite(v) and 0 < v <= 3600 for v in budgets.stall_s.values())
    assert all(math.isfinite(v) and 0 < v <= 3600 for v in budgets.phase_s.values())
    only_good = watch.verify_target(target, watch.Settings(min_samples=1), tmp_path / "c",
                                    transport=RecordedHost(snaps, history_text=first.history),
                                    clock=clock, sleep=clock.sleep)
    assert only_good.plan is not None and only_good.plan.budgets == budgets  # nothing changed
    ignored = [n for n in notes if "record ignored" in n]
    assert len(ignored) == len(bad_lines)
    assert all(n.startswith("lab5:/var/lib/vigil/history/vllm.jsonl line ") for n in ignored)


def _backwards_trace(tmp_path: Path) -> Path:
    import json

    lines = (TRACES
             / "lab-cold-ready.jsonl").read_text().splitlines()
    snaps = [json.loads(line) for line in lines]
    end = snaps[0]["time"] + snaps[-1]["time"]
    for s in snaps:  # the same start with its clock running backwards
        s["time"] = end - s["time"]
        for ln in s["journal"]["lines"]:
            ln["us"] = int(end * 1e6) - ln["us"]
    path = tmp_path / "backwards.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in snaps))
    return path


def test_i21_15_a_trace_whose_time_runs_backwards_never_replays_to_negative_phases(
        tmp_path: Path) -> None:
    from vigil.verify import replay

    path = _backwards_trace(tmp_path)
    out = replay.replay_file(path)
    assert all(p["duration_s"] >= 0 for p in out["phases"]), out["phases"]
    assert out["verdict"] != "ready"
    assert out["ignored"] == [f"{path}: 44 snapshots whose time runs backwards ignored "
                              "(the first: line 2, 2.1 s before line 1)"]
    # one snapshot stepping back in a good trace costs that snapshot, not the replay
    good = (TRACES
            / "lab-cold-ready.jsonl").read_text().splitlines()
    import json

    odd = json.loads(good[10])
    odd["time"] -= 3600.0
    glitch = tmp_path / "glitch.jsonl"
    glitch.write_text("\n".join([*good[:10], json.dumps(odd), *good[11:]]) + "\n")
    got = replay.replay_file(glitch)
    assert got["verdict"] == "ready" and all(p["duration_s"] >= 0 for p in got["phases"])
    assert len(got["ignored"]) == 1 and "line 11" in got["ignored"][0]


def test_i21_15_replay_prints_the_ignored_line_as_one_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _backwards_trace(tmp_path)
    _run_task("replay", _task_ctx(tmp_path / "none"), file=str(path))
    seen = capsys.readouterr()
    assert seen.err.count("warning: ") == 1 and "runs backwards" in seen.err
    assert "Traceback" not in seen.err


def test_a_host_repeating_its_lock_wait_is_said_to_wait_once(tmp_path: Path) -> None:
    """Issue 33 (minor): a host answering the lock with WAIT 100,000 times printed the
    wait 100,000 times (and any text it liked as the holder)."""
    from vigil.transport.local import LocalTransport
    from vigil.transport.lock import host_lock

    class Flooding(LocalTransport):
        def hold(self, command: str) -> Any:
            return super().hold("yes $'WAIT \\x1b[2Jevil' | head -20000; echo LOCKED; "
                                "sleep 60")

    said: list[str] = []
    with host_lock(Flooding("here"), HostVars(connection="local"), str(tmp_path / "l"),
                   "me", 5, said.append):
        pass
    assert said == ["waiting up to 5 s for the deploy lock held by [2Jevil"]
