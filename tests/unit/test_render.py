"""Rendered units: safe quoting, masked secrets, and systemd accepts every shipped profile."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO
from vigil.desired import inventory
from vigil.desired.render import TEMPLATES, env_quote, systemd_quote
from vigil.desired.targets import resolve
from vigil.errors import TemplateError

REPO_INV = REPO / "inventory"
SECRETS = {"HF_TOKEN": "hf_s3cr3t-value"}


@pytest.fixture(scope="module")
def inv() -> inventory.Inventory:
    return inventory.load(REPO_INV)


def _verify(
    unit_text: str, tmp_path: Path, name: str = "vllm.service"
) -> subprocess.CompletedProcess[str]:
    unit = tmp_path / name
    unit.write_text(unit_text)
    return subprocess.run(["systemd-analyze", "verify", str(unit)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("profile", sorted(p.stem for p in (REPO_INV / "models").glob("*.yml")))
def test_every_shipped_profile_passes_systemd_analyze_verify(
    inv: inventory.Inventory, profile: str, tmp_path: Path
) -> None:
    # The unit runs the environment's python; make that path exist under a temp root so
    # systemd-analyze can check ExecStart, and nothing else in the unit changes.
    env_root = tmp_path / "envs"
    (env_root / "current" / "bin").mkdir(parents=True)
    shutil.copy("/usr/bin/true", env_root / "current" / "bin" / "python")
    host = "llm-one" if profile != "tiny-cpu" else "llm-two"
    (t,) = resolve(inv, host, model=profile, sets=[f"env_root={env_root}"],
                   operator_env=SECRETS)
    proc = _verify(t.rendered.unit_text, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Unknown key" not in proc.stderr and "Invalid" not in proc.stderr, proc.stderr
    assert f"--model={t.profile.path}" in t.rendered.unit_text


def test_execstart_round_trips_hostile_values(inv: inventory.Inventory, tmp_path: Path) -> None:
    hostile = "x\" --api-key=stolen; $(reboot) `id` %n 100% \\ 'q'"
    (t,) = resolve(inv, "llm-one", model="glm-5",
                   sets=["served_model_name=" + json.dumps(hostile)],
                   operator_env=SECRETS)
    # the hostile string is one argv word and a value of --served-model-name, never an option
    assert f"--served-model-name={hostile}" in t.rendered.argv
    assert "--api-key=stolen;" not in t.rendered.argv
    line = next(x for x in t.rendered.unit_text.splitlines() if x.startswith("ExecStart="))
    # systemd's own parser: %% -> %, $$ -> $, then quote rules like the shell's
    words = shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))
    assert words == list(t.rendered.argv)
    assert _verify(t.rendered.unit_text.replace(t.rendered.paths.python, "/usr/bin/true"),
                   tmp_path).returncode == 0


def test_systemd_quote_escapes_specifiers_and_variables() -> None:
    assert systemd_quote('a"b') == '"a\\"b"'
    assert systemd_quote("100%") == '"100%%"'
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert systemd_quote("a\\b") == '"a\\\\b"'


def test_env_quote_keeps_values_literal() -> None:
    assert env_quote("plain") == "'plain'"
    assert env_quote("it's $HOME") == '"it\'s \\$HOME"'


def test_secrets_masked_in_every_shown_form(inv: inventory.Inventory) -> None:
    (t,) = resolve(inv, "llm-one", model="kimi-k2.5-nvfp4", operator_env=SECRETS)
    assert "hf_s3cr3t-value" in t.rendered.env_text
    assert "hf_s3cr3t-value" not in t.rendered.env_masked
    assert "HF_TOKEN='***'" in t.rendered.env_masked
    assert "hf_s3cr3t" not in t.rendered.unit_text  # secrets live only in the env file
    assert "HF_TOKEN" in t.rendered.secret_names


def test_unit_has_the_safety_settings(inv: inventory.Inventory) -> None:
    (t,) = resolve(inv, "llm-one", model="kimi-k2.5-nvfp4", operator_env=SECRETS)
    unit = t.rendered.unit_text
    for setting in ("Restart=on-failure", "RestartSec=30", "StartLimitBurst=3",
                    "KillMode=mixed", "TimeoutStopSec=90", "TimeoutStartSec=1800",
                    "LimitNOFILE=1048576", "User=vllm", "EnvironmentFile=/etc/vigil/vllm.env"):
        assert setting in unit


def test_template_error_names_template(inv: inventory.Inventory, tmp_path: Path) -> None:
    shutil.copytree(TEMPLATES, tmp_path / "t")
    bad = tmp_path / "t" / "vllm.service.j2"
    bad.write_text(bad.read_text() + "\nX={{ no_such_variable }}\n")
    with pytest.raises(TemplateError) as err:
        resolve(inv, "llm-one", model="glm-5", operator_env=SECRETS, template_dir=tmp_path / "t")
    assert "vllm.service.j2" in str(err.value) and "no_such_variable" in str(err.value)
    bad.write_text("{% if %}")
    with pytest.raises(TemplateError, match="line 1"):
        resolve(inv, "llm-one", model="glm-5", operator_env=SECRETS, template_dir=tmp_path / "t")


def test_render_names_the_file_of_every_key_of_a_merged_dict(tmp_path: Path) -> None:
    from vigil.desired import review

    root = tmp_path / "inventory"
    shutil.copytree(REPO_INV, root, ignore=shutil.ignore_patterns("hosts.d"))
    (root / "host_vars" / "llm-one.yml").write_text("env: {B: host}\n")
    inv = inventory.load(root)
    (t,) = resolve(inv, "llm-one", model="glm-5", sets=["env.C=flag"], operator_env=SECRETS)
    (line,) = [x for x in review.variables(t) if x.startswith("env ")]
    assert line.endswith("(B: host_vars/llm-one.yml; C: --set; "
                         "HF_HUB_OFFLINE: group_vars/all.yml)"), line
    (port,) = [x for x in review.variables(t) if x.startswith("port ")]
    assert port.endswith("(roles/service/defaults.yml)"), port  # one source: one name
    # the line above the variables says the order, Ansible's: host_vars/ beats the hosts file
    assert "hosts file's host vars < host_vars/<host> < --set" in review.PRECEDENCE
    assert "group_vars/<group> < hosts file's host vars" in review.PRECEDENCE
