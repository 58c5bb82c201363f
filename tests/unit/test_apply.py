"""Apply sends the plan and nothing else (issue 20.4): every action that reaches the agent
is a step of the plan, verbatim and in the plan's order, and a step with a condition
(``when``) only when that condition came. A recording transport stands in for the host."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.doubles import facts_for, target
from vigil.deploy import apply
from vigil.deploy.plan import Plan, make_plan
from vigil.errors import HostError
from vigil.report import Log

FIRST_DEPLOY = {"files": {"unit": None, "env": None}, "current": None, "env_complete": False,
                "packages": None, "backup": False, "health": None,
                "service": {"ActiveState": "inactive", "UnitFileState": "", "MainPID": "0",
                            "LoadState": "not-found"}}


def sent_by(plan: Plan, monkeypatch: pytest.MonkeyPatch, *, verified: bool = True,
            ) -> list[dict[str, Any]]:
    """The actions apply sends for ``plan``; the agent answers every one with ok and the
    new environment's verification passes (``verified``) or finds a broken pin."""
    sent: list[dict[str, Any]] = []

    def call(transport: object, hv: object, verb: str, request: dict[str, Any],
             **kw: object) -> dict[str, Any]:
        assert verb == "apply"
        sent.extend(request["actions"])
        return {"results": [{"ok": True, "kind": a["kind"]} for a in request["actions"]]}

    monkeypatch.setattr(apply, "call", call)
    monkeypatch.setattr(apply, "verify_install", lambda *a, **kw: [] if verified else [
        "torch 2.9.0 breaks pin: pinned ==2.10.0"])
    t = target()
    try:
        apply.apply_plan(object(), t, plan, lambda _: None)  # type: ignore[arg-type]
    except HostError:
        assert not verified, "only a refused environment fails this apply"
    return sent


PLANS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "a first deploy": (FIRST_DEPLOY, {}),
    "a reinstall": ({}, {"reinstall": True}),
    "a changed unit": ({"files": {"unit": "[Service]\nExecStart=/bin/old\n"}}, {}),
    "a stale process killed": ({}, {"kill_pids": (77,)}),
    "a restart": ({}, {"force_restart": True}),
}


@pytest.mark.parametrize("case", PLANS)
def test_apply_sends_each_unconditional_step_of_the_plan_verbatim_in_its_order(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    changes, options = PLANS[case]
    t = target()
    plan = make_plan("llm-one", t.stack, t.rendered, facts_for(t, **changes), **options)
    sent = sent_by(plan, monkeypatch)
    assert [a["kind"] for a in sent] == [a.kind for a in plan.actions if not a.when]
    for action in sent:  # the mark alone carries what the install reported
        wire = {k: v for k, v in action.items() if k != "packages"}
        assert wire in [a.wire() for a in plan.actions], f"{action['kind']} is not planned"


def test_a_new_environment_that_fails_verification_gets_the_planned_discard_and_no_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    t = target()
    plan = make_plan("llm-one", t.stack, t.rendered, facts_for(t, **FIRST_DEPLOY))
    sent = sent_by(plan, monkeypatch, verified=False)
    install, discard = plan.step("install_env"), plan.step("discard_env")
    assert install is not None and discard is not None and discard.when
    assert sent == [install.wire(), discard.wire()]


@pytest.mark.parametrize("case", PLANS)
def test_no_action_kind_reaches_the_agent_that_the_plan_did_not_list(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the outcome of the install, the kinds sent are kinds of the plan."""
    changes, options = PLANS[case]
    t = target()
    plan = make_plan("llm-one", t.stack, t.rendered, facts_for(t, **changes), **options)
    planned = {a.kind for a in plan.actions}
    for verified in (True, False):
        sent = {a["kind"] for a in sent_by(plan, monkeypatch, verified=verified)}
        assert sent <= planned, sorted(sent - planned)


def test_check_lists_the_discard_with_its_condition_and_a_deploy_that_never_needed_it_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    @contextmanager
    def held(*a: object, **kw: object) -> Iterator[object]:
        yield type("FakeTransport", (), {"round_trips": 2})()

    t = target()
    facts = facts_for(t, **FIRST_DEPLOY)
    monkeypatch.setattr(apply, "connect", held)
    monkeypatch.setattr(apply, "host_lock", held)
    monkeypatch.setattr(apply, "gather", lambda transport, t: facts)
    monkeypatch.setattr(apply, "check_host", lambda *a, **kw: None)
    monkeypatch.setattr(apply, "apply_plan", lambda *a, **kw: None)  # every step went well
    check = apply.deploy_host(t, apply.Options(check=True), Log())
    done = apply.deploy_host(t, apply.Options(wait=False), Log())
    assert [a.split(":", 1)[0] for a in check.actions][:3] == [
        "install_env", "discard_env (if the new environment fails verification)", "mark_env"]
    assert [a.split(":", 1)[0] for a in done.actions][:2] == ["install_env", "mark_env"]
    assert (check.status, done.status) == ("changed", "changed")
