"""Ansible Vault in an inventory (issue 29.6). Before: a `group_vars/gpu/vault.yml` made
by ansible-vault stopped the inventory ("expected a mapping of variables, got str"), and
an inline `!vault |` value was "invalid YAML".

Now: with ansible-core and ANSIBLE_VAULT_PASSWORD_FILE both are decrypted by ansible-core
itself and their values are masked in render; without, the file or the values are set
aside with one warning naming the file and secret_env. The vault texts are made here by
ansible-core's own `ansible-vault`-equivalent code (VaultLib.encrypt)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.paths import REPO
from vigil.desired import inventory, review, targets
from vigil.errors import ConfigError

vault_lib = pytest.importorskip("ansible.parsing.vault")
PASSWORD = "correct horse"


def encrypt(text: str, password: str = PASSWORD) -> str:
    secret = vault_lib.VaultSecret(password.encode())
    return bytes(vault_lib.VaultLib([("default", secret)]).encrypt(text, secret)).decode()


def inline(name: str, value: str) -> str:
    body = "\n".join(f"    {ln}" for ln in encrypt(value).splitlines())
    return f"{name}: !vault |\n{body}\n"


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "ansible"
    (root / "group_vars" / "gpu").mkdir(parents=True)
    for part in ("models", "stacks"):
        shutil.copytree(REPO / "inventory" / part, root / part)
    (root / "hosts.ini").write_text("[gpu]\ngpu-01 ansible_host=10.1.2.3\n")
    (root / "group_vars" / "all.yml").write_text(
        "gpu: {kind: H100, count: 8, memory_gib: 80}\nstack: vllm-0.16-nightly\n"
        "model: tiny-cpu\n")
    # a whole vault file, as `ansible-vault encrypt group_vars/gpu/vault.yml` leaves it
    (root / "group_vars" / "gpu" / "vault.yml").write_text(
        encrypt("vault_hf_token: hf_SECRETVALUE1\nssh_user: ops\n"))
    (root / "group_vars" / "gpu" / "main.yml").write_text(
        "connect_timeout_s: 7\n" + inline("ssh_key", "/keys/SECRETPATH2"))
    return root


def test_without_a_password_vault_is_set_aside_with_one_warning_per_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    root = _repo(tmp_path)
    inv = inventory.load(root)
    hv = inv.host_vars("gpu-01")
    assert (hv.ssh_user, hv.ssh_key, hv.connect_timeout_s) == ("root", None, 7.0)
    said = [w for w in inv.warnings if "Vault" in w or "!vault" in w]
    assert said == [  # the folder's files in name order
        f"{root / 'group_vars/gpu/main.yml'}: ssh_key encrypted with !vault: set aside; "
        "vigil decrypts Ansible Vault with ansible-core installed (pip install "
        "'vigil-vllm[vault]') and ANSIBLE_VAULT_PASSWORD_FILE set; a secret the service "
        "needs goes in secret_env, its value exported in your environment",
        f"not read: {root / 'group_vars/gpu/vault.yml'} is an Ansible Vault file; vigil "
        "decrypts Ansible Vault with ansible-core installed (pip install 'vigil-vllm[vault]') "
        "and ANSIBLE_VAULT_PASSWORD_FILE set; a secret the service needs goes in secret_env, "
        "its value exported in your environment"], said
    assert "SECRET" not in "\n".join(inv.warnings)


def test_with_the_password_file_ansible_core_decrypts_and_render_masks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _repo(tmp_path)
    password = tmp_path / "vault-pass"
    password.write_text(PASSWORD + "\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ssh config of this machine's
    inv = inventory.load(root)
    resolved = inv.resolve("gpu-01")
    assert (resolved.vars.ssh_user, resolved.vars.ssh_key) == ("ops", "/keys/SECRETPATH2")
    assert resolved.origin["ssh_user"] == "group_vars/gpu/vault.yml (ansible-vault)"
    assert resolved.origin["ssh_key"] == \
        "group_vars/gpu/main.yml (!vault, ansible-vault)"
    # a foreign variable of the vault is set aside by name, as any other, never its value
    assert any("vault_hf_token" in w for w in inv.warnings), inv.warnings
    (t,) = targets.resolve(inv, "gpu-01", require_secrets=False, local_files=False)
    shown = "\n".join(review.variables(t))
    assert "SECRETPATH2" not in shown and "SECRETVALUE1" not in shown
    user = next(ln for ln in shown.splitlines() if ln.startswith("ssh_user"))
    assert user.split("  (")[0].endswith('= "***"'), shown


def test_a_wrong_password_is_one_error_naming_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _repo(tmp_path)
    password = tmp_path / "vault-pass"
    password.write_text("not it\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password))
    with pytest.raises(ConfigError) as err:
        inventory.load(root)
    text = str(err.value)
    assert text.startswith(f"{root / 'group_vars/gpu/main.yml'}: cannot decrypt its "
                           "Ansible Vault (ssh_key) with the password of "
                           "ANSIBLE_VAULT_PASSWORD_FILE"), text
    assert "fix:" in text and "SECRET" not in text


def test_a_vault_value_in_env_is_refused_for_secret_env(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _repo(tmp_path)
    (root / "group_vars" / "gpu" / "main.yml").write_text(
        "env:\n" + "\n".join("  " + ln for ln in inline("HF_TOKEN", "hf_SECRET3")
                             .splitlines()) + "\n")
    password = tmp_path / "vault-pass"
    password.write_text(PASSWORD + "\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password))
    monkeypatch.setenv("HOME", str(tmp_path))
    inv = inventory.load(root)
    with pytest.raises(ConfigError) as err:
        targets.resolve(inv, "gpu-01", require_secrets=False, local_files=False)
    text = str(err.value)
    assert "env.HF_TOKEN of host gpu-01 comes from Ansible Vault" in text, text
    assert "secret_env" in text and "SECRET3" not in text


def test_without_ansible_core_a_password_alone_sets_vault_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    root = _repo(tmp_path)
    password = tmp_path / "vault-pass"
    password.write_text(PASSWORD + "\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password))
    monkeypatch.setitem(sys.modules, "ansible.parsing.vault", None)  # not installed
    inv = inventory.load(root)
    assert inv.host_vars("gpu-01").ssh_user == "root"
    assert sum("pip install 'vigil-vllm[vault]'" in w for w in inv.warnings) == 2
