"""Preflight's GPU count: every parallel dimension (tensor x pipeline x data) needs its
own GPUs, judged on the GPUs the host shows (a real 8x B200 capture, cut to 4)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.doubles import capture, facts_for, target
from vigil.deploy.preflight import problems


def _four_of_eight() -> dict[str, object]:
    raw = capture("b200_x8")
    head, *rows = str(raw["smi_gpus"]).splitlines()
    return {**raw, "smi_gpus": "\n".join([head, *rows[:4]]) + "\n"}


def test_data_parallel_counts_in_the_gpus_a_host_must_show() -> None:
    gpus = _four_of_eight()
    fits = target("tensor_parallel_size=4")
    assert not [e for e in problems("llm-one", fits.profile, fits.rendered,
                                    facts_for(fits, gpus=gpus), stack=fits.stack)
                if "GPUs; the host shows" in str(e)]
    t = target("tensor_parallel_size=4", "data_parallel_size=2")
    found = [str(e) for e in problems("llm-one", t.profile, t.rendered,
                                      facts_for(t, gpus=gpus), stack=t.stack)]
    assert any("data_parallel_size 2 = 8 GPUs; the host shows 4" in e for e in found), found


def test_a_flag_the_environments_vllm_lacks_is_refused_before_any_change() -> None:
    """The environment in use records its vLLM's own parser options (the agent, once):
    a rendered ExecStart option it lacks is a refusal naming the flag, the version and
    where to change it; with the flag known, nothing is refused."""
    t = target("extra_args=[--no-such-option=1]")
    flags = ["--" + w.split("=", 1)[0].lstrip("-") for w in t.rendered.argv
             if w.startswith("--")]
    parsed = {"version": "0.16.0rc2.dev344+gea5f903f8",
              "flags": [f for f in flags if f != "--no-such-option"]}
    found = [str(p) for p in problems(t.name, t.profile, t.rendered,
                                      facts_for(t, vllm_flags=parsed)) if "vLLM" in str(p)]
    assert len(found) == 1, found
    assert "rejects --no-such-option: its own argument parser has no such option" in found[0]
    assert "vLLM 0.16.0rc2.dev344+gea5f903f8 in " in found[0]
    assert "extra_args" in found[0] and "models/glm-5.yml" in found[0]
    known = {**parsed, "flags": flags}
    assert not [p for p in problems(t.name, t.profile, t.rendered,
                                    facts_for(t, vllm_flags=known)) if "vLLM" in str(p)]


# systemctl's words on a machine whose PID 1 is not systemd (this one: PID 1 is
# `process_api`), recorded verbatim from `systemctl show foo.service`
NO_SYSTEMD = ("System has not been booted with systemd as init system (PID 1). Can't "
              "operate.\nFailed to connect to bus: Host is down")


def test_a_host_without_systemd_as_pid_1_is_refused_first() -> None:
    """Issue 22.16: such a host passed preflight (`service: not loaded`) and a real apply
    then installed the environment before failing at daemon-reload."""
    t = target()
    facts = facts_for(t, init={"booted": False, "pid1": "process_api"},
                      service={"error": NO_SYSTEMD})
    found = [str(p) for p in problems(t.name, t.profile, t.rendered, facts)]
    assert found, "no refusal"
    assert "systemd is not running as PID 1 (PID 1 is process_api" in found[0]
    assert "booted with systemd as PID 1" in found[0]  # the fix
    # systemctl's own words are proof enough when the host's facts say nothing of PID 1
    found = [str(p) for p in problems(t.name, t.profile, t.rendered,
                                      facts_for(t, service={"error": NO_SYSTEMD}))]
    assert "systemctl cannot reach systemd: System has not been booted" in found[0]
    booted = facts_for(t, init={"booted": True, "pid1": "systemd"})
    assert not [p for p in problems(t.name, t.profile, t.rendered, booted)
                if "systemd" in str(p)]


def test_the_agent_reads_pid_1_as_systemd_itself_tests_for_it() -> None:
    """sd_booted(): systemd is PID 1 exactly when /run/systemd/system exists."""
    from tests.agent_payload import agent

    got = agent.init_facts()
    assert got["booted"] is os.path.isdir("/run/systemd/system")
    assert got["pid1"] == Path("/proc/1/comm").read_text().strip()
