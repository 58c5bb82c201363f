"""Roles as data: defaults and precedence, user roles rendered and planned (pure)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.paths import REPO
from vigil.deploy.plan import make_plan
from vigil.deploy.roles import parse_role_facts, plan_roles
from vigil.desired import inventory, review
from vigil.desired.roles import BUILTIN, ROLES_DIR, load_all
from vigil.desired.targets import resolve
from vigil.errors import ConfigError, RefusedError, TemplateError

USER_ROLES = REPO / "roles"  # this checkout's own roles (health-log); the built-ins ship
ENV = {"HF_TOKEN": "x"}
WITH_ROLE = "roles=[preflight,runtime,service,verify,health-log]"


@pytest.fixture
def inv_dir(tmp_path: Path) -> Path:
    target = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", target, ignore=shutil.ignore_patterns("hosts.d"))
    return target


@pytest.fixture
def roles_dir(tmp_path: Path) -> Path:
    target = tmp_path / "roles"
    shutil.copytree(USER_ROLES, target)
    return target


def _user_role(roles_dir: Path, name: str, role_yml: str, template: str = "[Unit]\n",
               defaults: str | None = None) -> Path:
    """roles/<name>/ with one template t.j2, its role.yml and, if given, its defaults."""
    mine = roles_dir / name
    (mine / "templates").mkdir(parents=True)
    (mine / "templates" / "t.j2").write_text(template)
    (mine / "role.yml").write_text(role_yml)
    if defaults is not None:
        (mine / "defaults.yml").write_text(defaults)
    return mine


def test_every_builtin_role_has_defaults_and_the_service_role_owns_the_templates() -> None:
    roles = load_all(ROLES_DIR)
    assert set(BUILTIN) <= set(roles)
    assert {"env_root", "keep_envs", "installer"} <= set(roles["runtime"].defaults)
    assert {"restart_sec", "start_limit_burst", "start_limit_interval_s", "timeout_stop_s",
            "limit_nofile", "port"} <= set(roles["service"].defaults)
    assert {"poll_s", "phase_budget_s", "stall_window_s"} <= set(roles["verify"].defaults)
    assert {"vllm.env.j2", "vllm.service.j2"} <= {
        p.name for p in (ROLES_DIR / "service" / "templates").iterdir()}
    assert not (REPO / "templates").exists()


def test_precedence_role_defaults_all_group_host_set(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    res = inv.resolve("llm-one")
    assert res.vars.restart_sec == 30 and res.origin["restart_sec"] == "roles/service/defaults.yml"
    (inv_dir / "group_vars" / "all.yml").write_text("restart_sec: 40\nkeep_envs: 1\n")
    (inv_dir / "group_vars" / "blackwell8.yml").write_text(
        (inv_dir / "group_vars" / "blackwell8.yml").read_text() + "restart_sec: 50\n")
    (inv_dir / "host_vars" / "llm-one.yml").write_text("restart_sec: 60\n")
    inv = inventory.load(inv_dir, USER_ROLES)
    one, two = inv.resolve("llm-one"), inv.resolve("llm-two")
    assert (two.vars.restart_sec, two.origin["restart_sec"]) == (50, "group_vars/blackwell8.yml")
    assert (one.vars.restart_sec, one.origin["restart_sec"]) == (60, "host_vars/llm-one.yml")
    assert (one.vars.keep_envs, one.origin["keep_envs"]) == (1, "group_vars/all.yml")
    flagged = inv.resolve("llm-one", {"restart_sec": 70})
    assert (flagged.vars.restart_sec, flagged.origin["restart_sec"]) == (70, "--set")


def test_unit_settings_come_from_the_host_variables(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    sets = ["restart_sec=7", "start_limit_burst=9", "start_limit_interval_s=99",
            "timeout_stop_s=611", "limit_nofile=65536"]
    (t,) = resolve(inv, "llm-one", model="glm-5", sets=sets, operator_env=ENV)
    unit = t.rendered.unit_text
    for line in ("RestartSec=7", "StartLimitBurst=9", "StartLimitIntervalSec=99",
                 "TimeoutStopSec=611", "LimitNOFILE=65536"):
        assert f"\n{line}\n" in unit


def test_runtime_role_settings_reach_the_plan(inv_dir: Path) -> None:
    from tests.doubles import facts_for

    inv = inventory.load(inv_dir, USER_ROLES)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV,
                   sets=["installer=pip", "min_free_gib=1"])
    facts = facts_for(t, packages=None, disk_free_bytes=2 * 2**30)
    plan = make_plan(t.name, t.stack, t.rendered, facts, host=t.vars)
    install = next(a for a in plan.actions if a.kind == "install_env")
    assert install.payload["installer"] == "pip"
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV, sets=["min_free_gib=5"])
    with pytest.raises(RefusedError, match="needs 5 GiB"):
        make_plan(t.name, t.stack, t.rendered, facts, host=t.vars)


def test_render_shows_where_each_value_came_from(inv_dir: Path, tmp_path: Path) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    (t,) = resolve(inv, "llm-one", model="glm-5", sets=["port=9000", WITH_ROLE],
                   operator_env=ENV, require_secrets=False)
    lines = review.variables(t)
    assert 'port                          = 9000  (--set)' in lines
    assert any(line.startswith("restart_sec ") and line.endswith("(roles/service/defaults.yml)")
               for line in lines)
    assert any(line.startswith("health_log_interval ") and "roles/health-log" in line
               for line in lines)
    written = review.write_files(t, tmp_path / "out")
    timer = tmp_path / "out" / "health-log" / "etc/systemd/system/vigil-health-log.timer"
    assert timer.is_file() and any(str(timer) in w for w in written)


def test_user_role_renders_with_host_and_role_variables(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV,
                   sets=[WITH_ROLE, "health_log_interval=30s", "port=8123"])
    (role,) = t.roles
    files = {f.dest: f for f in role.files}
    timer = files["/etc/systemd/system/vigil-health-log.timer"]
    assert "OnUnitActiveSec=30s\n" in timer.content and timer.restart == "vigil-health-log.timer"
    assert "http://127.0.0.1:8123/health" in files["/opt/vigil/health-log/check.py"].content
    assert files["/opt/vigil/health-log/check.py"].mode == "755"
    assert role.enable == ("vigil-health-log.timer",)


def test_a_host_without_the_role_gets_no_role_files(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV)
    assert t.roles == () and t.takes("service") and not t.takes("health-log")


def test_plan_of_a_user_role_converges_and_is_then_empty(inv_dir: Path) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV, sets=[WITH_ROLE])
    fresh = plan_roles(t.roles, parse_role_facts({}))
    kinds = [(a.kind, a.payload.get("path") or a.payload.get("args") or a.payload.get("unit"))
             for a in fresh]
    assert kinds == [
        ("write_file", "/opt/vigil/health-log/check.py"),
        ("write_file", "/etc/systemd/system/vigil-health-log.service"),
        ("write_file", "/etc/systemd/system/vigil-health-log.timer"),
        ("systemctl", ["daemon-reload"]),
        ("systemctl", ["enable", "vigil-health-log.timer"]),
        ("restart", "vigil-health-log.timer"),
    ]
    assert fresh[0].diff.startswith("--- /dev/null")
    # the host as the first converge left it: nothing to do
    files = {f.dest: {"text": f.content, "mode": f.mode, "owner": "root", "group": "root"}
             for f in t.roles[0].files}
    units = {"vigil-health-log.timer": {"UnitFileState": "enabled", "ActiveState": "active"}}
    assert plan_roles(t.roles, parse_role_facts({"files": files, "units": units})) == []
    # a changed mode rewrites the file, restarts nothing; a changed timer restarts the timer
    script = "/opt/vigil/health-log/check.py"
    timer = "/etc/systemd/system/vigil-health-log.timer"
    drift = {**files, script: {**files[script], "mode": "644"}}
    (only,) = plan_roles(t.roles, parse_role_facts({"files": drift, "units": units}))
    assert only.kind == "write_file" and "mode 644 -> 755" in only.reason
    drift = {**files, timer: {**files[timer], "text": "old\n"}}
    acts = plan_roles(t.roles, parse_role_facts({"files": drift, "units": units}))
    assert [a.kind for a in acts] == ["write_file", "systemctl", "restart"]
    assert acts[2].payload == {"unit": "vigil-health-log.timer"}


@pytest.mark.parametrize("bad, expect", [
    ("roles=[../etc]", "role name '../etc' is not valid"),
    ("roles=[Service]", "role name 'Service' is not valid"),
    ("roles=[node-exporter]", "no role named 'node-exporter'"),
    ("roles=[runtime]", "runtime and service go together"),
    ("roles=[service, service, runtime]", "lists a role twice"),
    ("roles=x", "roles must be a list"),
    ("health_log_timeout_s=soon", "expected int like the role's default 3"),
])
def test_bad_role_selection_is_one_clear_error(inv_dir: Path, bad: str, expect: str) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    sets = [bad] if bad.startswith("roles") else [WITH_ROLE, bad]
    with pytest.raises(ConfigError) as err:
        resolve(inv, "llm-one", model="glm-5", operator_env=ENV, sets=sets)
    assert expect in str(err.value)


@pytest.mark.parametrize("spec, expect", [
    ("files: [{template: t.j2, dest: /etc/../root/x}]", "plain absolute path"),
    ("files: [{template: t.j2, dest: relative/x}]", "files.0.dest"),
    ("files: [{template: ../t.j2, dest: /x}]", "files.0.template"),
    ("files: [{template: t.j2, dest: /x, mode: '0999'}]", "files.0.mode"),
    ("files: [{template: missing.j2, dest: /x}]", "template 'missing.j2' not found"),
    ("files: [{template: t.j2, dest: /x, restart: 'a b'}]", "files.0.restart"),
    ("enable: [sshd]", "enable.0"),
    ("files: [{template: t.j2, dest: /x, owner: 'root;rm'}]", "files.0.owner"),
])
def test_a_bad_user_role_is_refused_at_load(roles_dir: Path, inv_dir: Path, spec: str,
                                            expect: str) -> None:
    _user_role(roles_dir, "mine", spec + "\n", template="x\n")
    with pytest.raises(ConfigError) as err:
        inventory.load(inv_dir, roles_dir)
    assert expect in str(err.value) and "roles/mine/role.yml" in str(err.value)


def test_user_role_may_not_redefine_a_host_variable(roles_dir: Path, inv_dir: Path) -> None:
    (roles_dir / "mine").mkdir()
    (roles_dir / "mine" / "defaults.yml").write_text("port: 9100\n")
    with pytest.raises(ConfigError, match="'port' is a vigil host variable"):
        inventory.load(inv_dir, roles_dir)


def test_builtin_role_defaults_are_host_variables(roles_dir: Path, inv_dir: Path) -> None:
    (roles_dir / "service").mkdir()  # the ops repo's amendment of the built-in role
    (roles_dir / "service" / "defaults.yml").write_text("restart_secs: 5\n")
    with pytest.raises(ConfigError, match="unknown key 'restart_secs'"):
        inventory.load(inv_dir, roles_dir)


def test_undefined_template_variable_names_the_template(roles_dir: Path,
                                                        inv_dir: Path) -> None:
    tpl = roles_dir / "health-log" / "templates" / "vigil-health-log.timer.j2"
    tpl.write_text(tpl.read_text() + "{{ health_log_intervall }}\n")
    inv = inventory.load(inv_dir, roles_dir)
    with pytest.raises(TemplateError, match="health_log_intervall") as err:
        resolve(inv, "llm-one", model="glm-5", operator_env=ENV, sets=[WITH_ROLE])
    assert "vigil-health-log.timer.j2" in str(err.value)


def test_role_variable_in_group_vars_is_accepted_and_typo_is_not(inv_dir: Path) -> None:
    (inv_dir / "group_vars" / "all.yml").write_text("health_log_interval: 5min\n")
    inv = inventory.load(inv_dir, USER_ROLES)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV, sets=[WITH_ROLE])
    assert t.role_vars["health_log_interval"] == "5min"
    assert t.origin["health_log_interval"] == "group_vars/all.yml"
    (inv_dir / "group_vars" / "all.yml").write_text("health_log_intervl: 5min\n")
    with pytest.raises(ConfigError, match="did you mean 'health_log_interval'"):
        inventory.load(inv_dir, USER_ROLES)


def test_verify_role_overrides_phase_defaults_by_name(inv_dir: Path) -> None:
    from vigil.verify.budgets import BudgetKey, phase_defaults, plan_budgets
    from vigil.verify.catalog import PHASE

    inv = inventory.load(inv_dir, USER_ROLES)
    hv = inv.host_vars("llm-one", {"phase_budget_s": {"kv_cache": 999},
                                   "stall_window_s": {"compiling": 1500}, "poll_s": 2})
    # dicts merge key by key: the role's other phases stay
    assert hv.phase_budget_s["bootstrap"] == PHASE["bootstrap"].budget_s
    assert hv.poll_s == 2.0
    budgets, stalls = phase_defaults(hv.phase_budget_s, hv.stall_window_s)
    assert budgets["kv_cache"] == 999 and stalls["compiling"] == 1500
    key = BudgetKey(hardware="cpu-2c", gpu_kind="cpu", model="m", config_hash="c",
                    stack="s", cache="cold")
    plan = plan_budgets([], key, weights_gib_per_gpu=None, defaults=(budgets, stalls))
    assert plan.budgets.budget("kv_cache") == 999 and plan.budgets.stall("compiling") == 1500
    with pytest.raises(ConfigError, match="no watched phase named 'kv_cahce'"):
        phase_defaults({"kv_cahce": 1.0}, {})


def test_verify_role_defaults_name_every_watched_phase() -> None:
    from vigil.verify.budgets import WATCHED_PHASES, phase_defaults

    verify = load_all(ROLES_DIR)["verify"].defaults
    assert set(verify["phase_budget_s"]) == set(WATCHED_PHASES)
    assert set(verify["stall_window_s"]) == set(WATCHED_PHASES)
    phase_defaults(verify["phase_budget_s"], verify["stall_window_s"])  # all known names


def test_a_user_role_may_not_take_the_service_unit(roles_dir: Path, inv_dir: Path) -> None:
    _user_role(roles_dir, "mine",
               "files: [{template: t.j2, dest: /etc/systemd/system/vllm.service}]\n")
    with pytest.raises(ConfigError, match="not one of the role's own units"):
        inventory.load(inv_dir, roles_dir)
    # even allowed by the ops repo, the service role's unit stays the service role's
    (roles_dir / "allow.yml").write_text("mine: {units: [vllm.service]}\n")
    inv = inventory.load(inv_dir, roles_dir)
    with pytest.raises(ConfigError, match="which the service role already writes"):
        resolve(inv, "llm-one", model="glm-5", operator_env=ENV,
                sets=["roles=[runtime,service,mine]"])


def test_agent_writes_a_role_file_with_mode_and_owner_and_reads_it_back(
        tmp_path: Path, inv_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real agent functions on this machine: what plan_roles sends is what
    role_facts then reads back, so the next plan is empty (idempotence, without a host)."""
    import grp
    import os
    import pwd

    from tests.agent_payload import agent
    from vigil.deploy.roles import request
    from vigil.desired.roles import RenderedFile, RenderedRole

    monkeypatch.setattr(agent, "WRITTEN", str(tmp_path / "state" / "role-hashes.json"))
    me = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    dest = tmp_path / "etc" / "thing.conf"
    role = RenderedRole("mine", (RenderedFile("mine", str(dest), "a=1\n", "640", me, None),),
                        ())
    facts = parse_role_facts(agent.role_facts(request((role,))))
    (write,) = plan_roles((role,), facts)
    reply = agent.apply({"paths": {}, "actions": [write.wire()]})
    assert reply["results"] == [{"ok": True, "kind": "write_file"}]
    assert dest.read_text() == "a=1\n" and dest.stat().st_mode & 0o777 == 0o640
    back = agent.role_facts(request((role,)))["files"][str(dest)]
    assert {k: back[k] for k in ("text", "mode", "owner", "group", "vigil")} == {
        "text": "a=1\n", "mode": "640", "owner": me, "group": group, "vigil": True}
    assert plan_roles((role,), parse_role_facts(agent.role_facts(request((role,))))) == []
    bad = {**write.wire(), "owner": "no-such-user-here"}
    (res,) = agent.apply({"paths": {}, "actions": [bad]})["results"]
    assert res["ok"] is False and "no user or group no-such-user-here" in res["error"]


def test_render_of_a_host_with_only_user_roles_writes_only_their_files(
        inv_dir: Path, tmp_path: Path) -> None:
    inv = inventory.load(inv_dir, USER_ROLES)
    (t,) = resolve(inv, "llm-one", model="glm-5", sets=["roles=[health-log]"],
                   operator_env=ENV, require_secrets=False)
    written = review.write_files(t, tmp_path / "out")
    assert len(written) == 3 and not (tmp_path / "out" / "vllm.service").exists()
    assert all("/health-log/" in w for w in written)


def _role_with(dest: str, restart: str | None = "thing.service") -> Any:
    from vigil.desired.roles import RenderedFile, RenderedRole
    return RenderedRole("mine", (RenderedFile("mine", dest, "a=2\n", "644", "root", restart),),
                        ())


def test_the_release_backup_keeps_the_role_files_the_deploy_writes() -> None:
    from vigil.deploy.plan import Action
    from vigil.deploy.roles import with_role_backup
    role = _role_with("/etc/thing.conf")
    (write, restart) = plan_roles((role,), parse_role_facts({}))
    service = (Action("backup", "keep"), Action("write_unit", "changed", {"content": "u"}))
    plan = with_role_backup(service, [write, restart], (role,), release_exists=True)
    assert [a.kind for a in plan] == ["backup", "write_unit", "write_file", "restart"]
    assert plan[0].payload == {"files": [{"path": "/etc/thing.conf",
                                          "restart": "thing.service"}]}
    # only the role changed: a backup of the running release is added before its writes
    alone = with_role_backup((), [write, restart], (role,), release_exists=True)
    assert [a.kind for a in alone] == ["backup", "write_file", "restart"]
    assert alone[0].payload["files"][0]["path"] == "/etc/thing.conf"
    # nothing deployed yet: there is no release to keep
    assert [a.kind for a in with_role_backup((), [write], (role,), release_exists=False)] \
        == ["write_file"]
    # no role file written: the service plan is left as it was
    assert with_role_backup(service, [restart], (role,), release_exists=True) \
        == (*service, restart)


def test_a_rollback_puts_role_files_back_and_removes_new_ones(tmp_path: Path) -> None:
    """The agent's half, on local files: backup, write, then what the rollback verb does
    before it asks systemd to restart (which this machine cannot)."""
    from tests.agent_payload import agent
    paths = {"unit": str(tmp_path / "u.service"), "env": str(tmp_path / "u.env"),
             "current": str(tmp_path / "current"), "backup_dir": str(tmp_path / "backup")}
    old, new = tmp_path / "etc" / "old.conf", tmp_path / "etc" / "new.conf"
    old.parent.mkdir()
    old.write_text("a=1\n")
    old.chmod(0o640)
    files = [{"path": str(old), "restart": "thing.service"}, {"path": str(new), "restart": None}]
    reply = agent.apply({"paths": paths, "actions": [
        {"kind": "backup", "files": files},
        {"kind": "write_file", "path": str(old), "content": "a=2\n", "mode": "644",
         "owner": "root"},
        {"kind": "write_file", "path": str(new), "content": "b\n", "mode": "644",
         "owner": "root"}]})
    assert all(r["ok"] for r in reply["results"]), reply
    kept = agent.kept_role_files(paths["backup_dir"])
    assert [(k["path"], k["text"]) for k in kept] == [(str(old), "a=1\n"), (str(new), None)]
    assert agent.restore_role_files(kept) == [str(old), str(new)]
    assert old.read_text() == "a=1\n" and old.stat().st_mode & 0o777 == 0o640
    assert not new.exists()
    # a kept copy that went missing is never taken for "absent before": the file stays
    (tmp_path / "backup" / "file-0").unlink()
    old.write_text("a=3\n")
    assert [k["path"] for k in agent.kept_role_files(paths["backup_dir"])] == [str(new)]


def test_an_ops_repo_role_folder_overrides_a_builtin_template_by_name(
        inv_dir: Path, roles_dir: Path, tmp_path: Path) -> None:
    """User roles come first, then the built-in ones: a roles/service/templates/ of the
    ops repo with one template replaces that file only (the other comes from vigil), its
    defaults.yml amends the service role's, and render names the file each came from."""
    from vigil.desired.render import TEMPLATES

    mine = roles_dir / "service" / "templates"
    mine.mkdir(parents=True)  # roles_dir: this checkout's roles/, which has no service/
    (mine / "vllm.service.j2").write_text(
        (TEMPLATES / "vllm.service.j2").read_text().replace(
            "[Service]\n", "[Service]\n# site policy: pinned to NUMA node 0\n"))
    (roles_dir / "service" / "defaults.yml").write_text("restart_sec: 12\n")
    inv = inventory.load(inv_dir, roles_dir)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV,
                   template_dir=[mine, TEMPLATES])
    assert "# site policy: pinned to NUMA node 0\n" in t.rendered.unit_text
    assert "RestartSec=12\n" in t.rendered.unit_text
    assert inv.roles["service"].defaults["timeout_stop_s"] == \
        load_all(ROLES_DIR)["service"].defaults["timeout_stop_s"]  # the rest: built-in
    assert t.rendered.templates == {"vllm.service.j2": str(mine / "vllm.service.j2"),
                                    "vllm.env.j2": str(TEMPLATES / "vllm.env.j2")}
    written = review.write_files(t, tmp_path / "out")
    assert any(w.endswith(f"(from {mine / 'vllm.service.j2'})") for w in written), written


@pytest.mark.parametrize("role, spec", [
    ("poweroff", "files: [{template: t.j2, dest: /etc/systemd/system/poweroff.target}]\n"
                 "enable: [poweroff.target]"),
    ("etc", "files: [{template: t.j2, dest: /etc/systemd/system/etc.mount}]\n"
            "enable: [etc.mount]"),
    ("vllm", "files: [{template: t.j2, dest: /etc/systemd/system/vllm.service.d/x.conf}]"),
    ("ssh", "files: [{template: t.j2, dest: /etc/systemd/system/ssh.service}]"),
    ("systemd", "files: [{template: t.j2, dest: "
                "/etc/systemd/system/systemd-journald.service.d/x.conf}]"),
    ("ray", "files: [{template: t.j2, dest: /etc/systemd/system/ray-head.service}]"),
])
def test_a_role_named_for_a_system_unit_does_not_own_it(roles_dir: Path, inv_dir: Path,
                                                        role: str, spec: str) -> None:
    """Issue 33.5: confinement was decided by the role's own name: a role called poweroff
    placed and enabled poweroff.target, one called etc mounted over /etc, vllm, ssh and
    systemd overrode those services. allow.yml is the only way past it."""
    _user_role(roles_dir, role, spec + "\n")
    with pytest.raises(ConfigError, match="it is the host's or vigil's own") as err:
        inventory.load(inv_dir, roles_dir)
    assert f"roles/{role}/role.yml" in str(err.value) and "allow.yml" in str(err.value)
    unit = spec.split("/etc/systemd/system/", 1)[1].split("}", 1)[0].split(".d/", 1)[0]
    (roles_dir / "allow.yml").write_text(f"{role}: {{units: [{unit}]}}\n")
    inventory.load(inv_dir, roles_dir)  # named in allow.yml: the operator's own choice


def test_a_role_still_owns_its_own_services_and_timers(roles_dir: Path, inv_dir: Path) -> None:
    _user_role(
        roles_dir, "gpu-exporter",
        "files: [{template: t.j2, dest: /etc/systemd/system/gpu-exporter.service},\n"
        "        {template: t.j2, dest: /etc/systemd/system/vigil-gpu-exporter.timer}]\n"
        "enable: [gpu-exporter.service, vigil-gpu-exporter.timer]\n")
    assert "gpu-exporter" in inventory.load(inv_dir, roles_dir).roles


def test_render_masks_secrets_at_any_depth_and_keeps_a_role_files_mode(
        roles_dir: Path, inv_dir: Path, tmp_path: Path) -> None:
    """Issue 33 (minor): overrides.env.HF_TOKEN and a role default named *_token were
    printed by render; a 0600 role file was written 0644 under --out."""
    _user_role(roles_dir, "hub",
               "files: [{template: t.j2, dest: /etc/vigil/hub/hub.conf, mode: '0600'}]\n",
               template="token={{ hub_token }}\n",
               defaults="hub_token: hub-role-secret\nhub_port: 7\n")
    inv = inventory.load(inv_dir, roles_dir)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV, require_secrets=False,
                   sets=["roles=[runtime,service,hub]",
                         'overrides={"env": {"HF_TOKEN": "hf_nested_secret", "A": "1"}}'])
    shown = "\n".join(review.variables(t))
    assert "hf_nested_secret" not in shown and "hub-role-secret" not in shown
    assert '"HF_TOKEN": "***"' in shown and 'hub_token' in shown and '"A": "1"' in shown
    review.write_files(t, tmp_path / "out")
    conf = tmp_path / "out" / "hub" / "etc/vigil/hub/hub.conf"
    assert oct(conf.stat().st_mode & 0o777) == "0o600"


def test_check_names_what_only_allow_yml_lets_a_role_touch(roles_dir: Path,
                                                           inv_dir: Path) -> None:
    """Issue 33.5: allow.yml is the only way past confinement, and the plan says when a
    file or unit goes through it; the role's own files and units say nothing more."""
    _user_role(
        roles_dir, "proxy",
        "files: [{template: t.j2, dest: /etc/nginx/conf.d/vllm.conf, restart: nginx.service},\n"
        "        {template: t.j2, dest: /etc/vigil/proxy/own.conf}]\n"
        "enable: [nginx.service]\n")
    (roles_dir / "allow.yml").write_text(
        "proxy: {paths: [/etc/nginx/conf.d/], units: [nginx.service]}\n")
    inv = inventory.load(inv_dir, roles_dir)
    (t,) = resolve(inv, "llm-one", model="glm-5", operator_env=ENV,
                   sets=["roles=[runtime,service,proxy]"])
    (role,) = t.roles
    assert role.allowed == ("/etc/nginx/conf.d/vllm.conf", "nginx.service")
    reasons = [a.reason for a in plan_roles(t.roles, parse_role_facts({}))]
    assert "proxy: /etc/nginx/conf.d/vllm.conf: new file, allowed by roles/allow.yml" \
        in reasons
    assert "proxy: /etc/vigil/proxy/own.conf: new file" in reasons
    assert "proxy: start at boot (allowed by roles/allow.yml)" in reasons
