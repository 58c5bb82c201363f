"""Shared fixtures: the real lab hosts (see tests/lab_fixtures.py) and small inventories."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.lab_fixtures import lab_hosts
from tests.paths import REPO
from vigil.desired import inventory
from vigil.desired import targets as targets_mod

__all__ = ["lab_hosts", "target_in"]



@pytest.fixture(autouse=True)
def _agent_records_hashes_in_a_scratch_file(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    """The agent, called in-process, records the hashes of the role files it writes in
    /var/lib/vigil; a test on this machine records them in a scratch file instead."""
    from tests.agent_payload import agent

    monkeypatch.setattr(agent, "WRITTEN", str(tmp_path_factory.mktemp("agent-state") /
                                               "role-hashes.json"))
    yield


def target_in(tmp_path: Path, hosts_yml: str, host: str,
              operator_env: Mapping[str, str] | None = None) -> targets_mod.Target:
    """Resolve `host` in a throwaway inventory: the shipped profiles and stacks plus
    the given hosts.yml."""
    inv = tmp_path / "inventory"
    for part in ("models", "stacks"):
        shutil.copytree(REPO / "inventory" / part, inv / part)
    (inv / "hosts.yml").write_text(hosts_yml)
    return targets_mod.resolve(inventory.load(inv), host, operator_env=operator_env or {})[0]
