"""The pure plan: nothing to do when the host matches; restart only on real change."""

from __future__ import annotations

from typing import Any

import pytest

from tests.doubles import facts_for, target
from tests.paths import REPO
from vigil.deploy.facts import HostFacts
from vigil.deploy.plan import make_plan
from vigil.deploy.preflight import check_host
from vigil.desired.targets import Target
from vigil.errors import PermissionDeniedError, RefusedError

REPO_INV = REPO / "inventory"
def kinds(t: Target, f: HostFacts, **kw: Any) -> list[str]:
    return [a.kind for a in make_plan("llm-one", t.stack, t.rendered, f, **kw).actions]


def test_matching_host_has_nothing_to_do() -> None:
    t = target()
    plan = make_plan("llm-one", t.stack, t.rendered, facts_for(t))
    assert plan.actions == () and not plan.restarts
    assert plan.describe() == ["nothing to do"]


def test_force_restart_restarts_only() -> None:
    t = target()
    assert kinds(t, facts_for(t), force_restart=True) == ["restart"]


def test_changed_max_model_len_rewrites_unit_and_restarts() -> None:
    old = target()
    new = target("max_model_len=100000")
    plan = make_plan("llm-one", new.stack, new.rendered, facts_for(old))
    assert [a.kind for a in plan.actions] == [
        "backup", "write_unit", "systemctl", "restart"]
    reason = plan.actions[1].reason
    assert "--max-model-len=200000 -> --max-model-len=100000" in reason
    assert plan.actions[2].payload["args"] == ["daemon-reload"]
    assert "-  \"--max-model-len=200000\"" not in plan.actions[1].diff  # a real unified diff
    assert "+ExecStart=" in plan.actions[1].diff and "-ExecStart=" in plan.actions[1].diff


def test_env_only_change_restarts_without_daemon_reload_and_masks_secret() -> None:
    old = target()
    new = target(env={"HF_TOKEN": "hf_new_secret"})
    plan = make_plan("llm-one", new.stack, new.rendered, facts_for(old))
    assert [a.kind for a in plan.actions] == ["backup", "write_env", "restart"]
    write = plan.actions[1]
    assert write.reason == "changed: HF_TOKEN (secret)"
    assert "hf_new_secret" not in write.diff and "hf_old" not in write.diff
    assert write.payload["mode"] == "600"


def test_first_deploy_installs_switches_writes_enables_starts() -> None:
    t = target()
    f = facts_for(t, files={"unit": None, "env": None}, current=None, env_complete=False,
                  packages=None, service={"ActiveState": "inactive", "UnitFileState": "",
                                          "MainPID": "0", "LoadState": "not-found"},
                  health=None, backup=False)
    assert kinds(t, f) == ["install_env", "discard_env", "mark_env", "switch_env",
                           "write_env", "write_unit", "systemctl", "systemctl", "restart"]


def test_drifted_package_reinstalls() -> None:
    t = target()
    f = facts_for(t, packages={**t.stack.packages, "flashinfer-cubin": "0.6.3"})
    plan = make_plan("llm-one", t.stack, t.rendered, f)
    assert plan.actions[0].kind == "install_env"
    assert "flashinfer-cubin 0.6.3 != 0.6.4" in plan.actions[0].reason
    assert plan.restarts


def test_stopped_service_is_started_without_writes() -> None:
    t = target()
    f = facts_for(t, service={"ActiveState": "failed", "SubState": "failed"})
    plan = make_plan("llm-one", t.stack, t.rendered, f)
    assert [a.kind for a in plan.actions] == ["restart"]
    assert plan.actions[0].reason == "service is failed"


def test_refusals_carry_the_evidence() -> None:
    t = target()
    with pytest.raises(RefusedError, match="model directory /srv/models/glm-5-nvfp4"):
        check_host("llm-one", t.profile, t.rendered, facts_for(t, model={"exists": False}))
    small = facts_for(t, model={"config": {"max_position_embeddings": 131072}})
    with pytest.raises(RefusedError, match="above the model's max_position_embeddings 131072"):
        check_host("llm-one", t.profile, t.rendered, small)
    with pytest.raises(RefusedError, match="service user vllm does not exist"):
        check_host("llm-one", t.profile, t.rendered, facts_for(t, service_user_exists=False))
    with pytest.raises(PermissionDeniedError, match="may not write /etc/systemd/system"):
        check_host("llm-one", t.profile, t.rendered, facts_for(t, uid=1000, writable={
            "unit": False}))


def test_install_refused_without_disk() -> None:
    t = target()
    f = facts_for(t, env_complete=False, disk_free_bytes=2 * 2**30)
    with pytest.raises(RefusedError, match=r"2\.0 GiB free"):
        make_plan("llm-one", t.stack, t.rendered, f)


def test_the_plan_lists_every_action_apply_sends_marking_or_discarding_the_new_environment(
) -> None:
    """--check shows the whole truth: what follows the install's verification is planned
    with its reason right after install_env, naming the environment: discard_env, only
    if it fails (shown with that condition), else mark_env."""
    t = target()
    f = facts_for(t, packages=None)
    plan = make_plan("llm-one", t.stack, t.rendered, f)
    install, discard, mark = plan.actions[:3]
    assert (install.kind, discard.kind, mark.kind) == ("install_env", "discard_env", "mark_env")
    env_dir = install.payload["env_dir"]
    assert mark.payload == discard.payload == {"env_dir": env_dir}
    assert (discard.when, mark.when) == ("the new environment fails verification", "")
    assert "passed verification" in mark.reason and "discarded" in mark.reason
    lines = plan.describe()
    assert lines[1] == (f"discard_env (if the new environment fails verification): remove "
                        f"{env_dir}, which the running release never used; nothing after "
                        "it runs")
    assert lines[2].startswith("mark_env: mark ")


def test_a_hosts_huge_or_unbalanced_execstart_is_a_change_never_a_spin_or_a_crash() -> None:
    """Issue 33 (minor): a 6 MB ExecStart in the host's unit spun shlex for 16 min (it
    builds a long word a character at a time); an unbalanced quote raised ValueError."""
    from vigil.deploy.plan import exec_words, unit_change_reason

    ours = "[Service]\nExecStart=/opt/v/bin/python -m vllm --port=8000\n"
    huge = "[Service]\nExecStart=/opt/v/bin/python -m vllm --x=" + "a" * 6_000_000 + "\n"
    assert unit_change_reason(huge, ours) == "ExecStart changed"  # (the old: 16 min)
    assert unit_change_reason("[Service]\nExecStart=/bin/x 'open\n", ours) == \
        "ExecStart changed"
    assert exec_words("/bin/x --a=1 'b c'") == ["/bin/x", "--a=1", "b c"]
    assert unit_change_reason(ours, ours.replace("8000", "8001")) == \
        "ExecStart changed (--port=8000 -> --port=8001)"
