"""Shared fixtures: the real lab hosts (see tests/lab_fixtures.py); the folder a test
lives in says its kind. Shared doubles and builders: tests/doubles.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests import lanes
from tests.lab_fixtures import lab_hosts
from tests.paths import TESTS

__all__ = ["lab_hosts"]

LAB = TESTS / "lab"

# Unit tests share the machine with the lab's vLLM starts (./dev test runs them side by
# side): a property test is judged by its examples, never by how fast a loaded CPU ran one.
settings.register_profile("vigil", deadline=None)
settings.load_profile("vigil")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/lab/ needs lab hosts: it is marked ``lab`` by its folder,
    so ``-m "not lab and not vllm"`` selects exactly the tests under tests/unit/; and its
    module says which lab hosts it drives (its lane: tests/lanes.py)."""
    lab_items = [i for i in items if Path(i.path).resolve().is_relative_to(LAB)]
    for item in lab_items:
        item.add_marker(pytest.mark.lab)
    lanes.check_marked(lab_items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N --dist loadgroup`` (./dev test): the lab lanes side by side, each in one
    worker, and the unit tests wherever a worker is free."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return lanes.LaneScheduling(config, lanes.lanes(lanes.lab_modules()), log)


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
