"""Ansible Vault in an inventory (issue 29.6): a vars file that is one vault
(``$ANSIBLE_VAULT;1.1;AES256`` …) and a ``!vault |`` value inside a plain one.

With ansible-core installed (``pip install 'vigil-vllm[vault]'``) and the user's vault
password (``ANSIBLE_VAULT_PASSWORD_FILE``, else ansible.cfg's ``vault_password_file`` as
ansible-core finds it: a file, or a script that prints it) they are decrypted by
ansible-core's own vault code, never a copy of it; a value from a vault is shown masked
wherever vigil shows variables. Without either, the file or the values are set aside
with one warning naming the file and what to do (``secret_env``: vigil's secrets come
from the operator's environment).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vigil.desired.inputs import read_input
from vigil.desired.yamlfile import StrictLoader, yaml_errors
from vigil.errors import ConfigError

HEADER = "$ANSIBLE_VAULT;"
MARK = "ansible-vault"  # in a layer's name: render masks what came from it
HOW = ("vigil decrypts Ansible Vault with ansible-core installed (pip install "
       "'vigil-vllm[vault]') and ANSIBLE_VAULT_PASSWORD_FILE set; a secret the service "
       "needs goes in secret_env, its value exported in your environment")


@dataclass(frozen=True)
class Vaulted:
    """A ``!vault`` value, still encrypted."""

    text: str


class VaultLoader(StrictLoader):
    """vigil's strict loader that also knows Ansible's ``!vault`` tag."""


def _vaulted(loader: yaml.SafeLoader, node: yaml.Node) -> Vaulted:
    return Vaulted(str(loader.construct_scalar(node)))  # type: ignore[arg-type]


VaultLoader.add_constructor("!vault", _vaulted)


@dataclass
class Read:
    data: Any  # the file's variables, decrypted or with vaulted values set aside
    vaulted: list[str] = field(default_factory=list)  # keys (dotted) that were !vault
    whole: bool = False  # the file was one vault
    warning: str | None = None


def _decrypter(path: Path) -> Any | None:
    """ansible-core's VaultLib with the user's password, or None where either is absent."""
    try:
        from ansible.parsing.dataloader import DataLoader
        from ansible.parsing.vault import VaultLib, get_file_vault_secret
    except ImportError:
        return None
    password_file = os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
    if not password_file:
        # ansible.cfg's vault_password_file, as ansible-core's own settings find it
        from ansible import constants

        password_file = getattr(constants, "DEFAULT_VAULT_PASSWORD_FILE", None)
    if not password_file:
        return None
    try:
        secret = get_file_vault_secret(filename=os.path.expanduser(password_file),
                                       vault_id="default", loader=DataLoader())
        secret.load()
    except Exception as exc:  # ansible's AnsibleError and OSError: a user's file
        raise ConfigError(f"cannot read the vault password: {str(exc).splitlines()[0]}",
                          file=password_file, key="ANSIBLE_VAULT_PASSWORD_FILE",
                          fix=f"point ANSIBLE_VAULT_PASSWORD_FILE at the vault password file "
                          f"(needed for {path})") from None
    return VaultLib([("default", secret)])


def _decrypt(vault: Any, text: str, path: Path, key: str | None) -> str:
    try:
        return bytes(vault.decrypt(text.strip().encode())).decode()
    except Exception:  # ansible's AnsibleVaultError: wrong password, damaged text
        where = f" ({key})" if key else ""
        raise ConfigError(f"cannot decrypt its Ansible Vault{where} with the password of "
                          "ANSIBLE_VAULT_PASSWORD_FILE", file=str(path),
                          fix="check the password file (ansible-vault view FILE opens it "
                          "with the same one)") from None


def read_vars(path: Path) -> Read:
    """A vars file with its vault decrypted, or set aside with a warning."""
    text = read_input(path)
    if text.lstrip().startswith(HEADER):
        vault = _decrypter(path)
        if vault is None:
            return Read({}, whole=True, warning=f"not read: {path} is an Ansible Vault "
                        f"file; {HOW}")
        text = _decrypt(vault, text, path, None)
        return Read(_parse(text, path), whole=True)
    data = _parse(text, path)
    found = list(_walk(data, ""))
    if not found:
        return Read(data)
    keys = [k for k, _ in found]
    inside = [k for k in keys if "[" in k]
    if inside:  # render could not keep it masked: its place has no name of its own
        raise ConfigError(f"{inside[0]} is a !vault value inside a list", file=str(path),
                          key=inside[0], fix="give it a variable of its own, or put its "
                          "name in secret_env and export it")
    vault = _decrypter(path)
    for key, (holder, slot) in found:
        if vault is None:
            del holder[slot]
        else:
            holder[slot] = _decrypt(vault, holder[slot].text, path, key)
    if vault is None:
        return Read(data, keys, warning=f"{path}: {', '.join(keys)} encrypted with !vault: "
                    f"set aside; {HOW}")
    return Read(data, keys)


def pluck(data: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """Move the values at the dotted keys out of data into a mapping of their own."""
    out: dict[str, Any] = {}
    for key in keys:
        *path, last = key.split(".")
        src, dst = data, out
        for part in path:
            src, dst = src[part], dst.setdefault(part, {})
        dst[last] = src.pop(last)
    return out


def _parse(text: str, path: Path) -> Any:
    loader = VaultLoader(text)
    try:
        with yaml_errors(path):
            return loader.get_single_data()
    finally:
        loader.dispose()


def _walk(data: Any, prefix: str) -> list[tuple[str, tuple[Any, Any]]]:
    """(dotted key, (container, slot)) of every !vault value, depth first."""
    out: list[tuple[str, tuple[Any, Any]]] = []
    items: list[tuple[Any, Any]] = list(data.items()) if isinstance(data, dict) else \
        list(enumerate(data)) if isinstance(data, list) else []
    for slot, value in items:
        key = f"{prefix}{slot}" if isinstance(data, dict) else f"{prefix[:-1]}[{slot}]"
        if isinstance(value, Vaulted):
            out.append((key, (data, slot)))
        else:
            out += _walk(value, f"{key}.")
    return out
