"""Shared fixtures: the real lab hosts (see tests/lab_fixtures.py); the folder a test
lives in says its kind. Shared doubles and builders: tests/doubles.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.lab_fixtures import lab_hosts
from tests.paths import TESTS

__all__ = ["lab_hosts"]

LAB = TESTS / "lab"

# Unit tests share the machine with the lab's vLLM starts (./dev test runs them side by
# side): a property test is judged by its examples, never by how fast a loaded CPU ran one.
settings.register_profile("vigil", deadline=None)
settings.load_profile("vigil")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/lab/ needs lab hosts: it is marked ``lab`` by its folder,
    so ``-m "not lab and not vllm"`` selects exactly the tests under tests/unit/.

    Each lab module says which lab hosts it drives (``pytest.mark.drives(1, 2)``).
    Modules that share a host, directly or through another module, form one lane (an
    ``xdist_group``): under ``pytest -n N --dist loadgroup`` a lane runs in one worker,
    in file order, and lanes run side by side, so no two workers ever drive one host."""
    lab_items = [i for i in items if Path(i.path).resolve().is_relative_to(LAB)]
    for item in lab_items:
        item.add_marker(pytest.mark.lab)
    for item, lane in lanes(lab_items).items():
        item.add_marker(pytest.mark.xdist_group(lane))


def lanes(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """Each lab test's lane: the connected sets of the hosts its module drives."""
    hosts_of: dict[Path, frozenset[int]] = {}
    for item in items:
        mark = item.get_closest_marker("drives")
        if mark is None or not mark.args:
            raise pytest.UsageError(
                f"{item.path.name}: a lab module says which lab hosts it drives: "
                "pytestmark = [..., pytest.mark.drives(1, 2)]")
        hosts_of[Path(item.path)] = frozenset(int(i) for i in mark.args)
    merged: list[frozenset[int]] = []
    for hosts in hosts_of.values():
        touching = [m for m in merged if m & hosts]
        merged = [m for m in merged if not m & hosts] + [hosts.union(*touching)]
    name = {m: "lab-hosts-" + ",".join(map(str, sorted(m))) for m in merged}
    return {item: next(name[m] for m in merged if m & hosts_of[Path(item.path)])
            for item in items}


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
