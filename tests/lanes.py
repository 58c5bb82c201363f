"""Lab lanes: lab modules that drive a common lab host run one after another in one
pytest-xdist worker; lanes run side by side, and beside the unit tests.

Each lab module says which lab hosts it drives (``pytest.mark.drives(1, 2)`` in its
``pytestmark``). A lane is a connected set of modules: two modules that share a host,
directly or through a third, are one lane, so no two workers ever drive one host.

xdist's own ``loadgroup`` reads ``xdist_group`` marks by renaming each test's node id,
which pytest 9 no longer lets a plugin do; so the lanes are a scheduler of their own
(``pytest_xdist_make_scheduler`` in conftest.py), worked out in the controller from the
modules' marks.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.paths import REPO, TESTS

LAB = TESTS / "lab"
UNMARKED = ("a lab module says which lab hosts it drives: "
            "pytestmark = [..., pytest.mark.drives(1, 2)]")


def drives(pytestmark: Any) -> frozenset[int] | None:
    """The lab host numbers a module's ``pytestmark`` says it drives, or None."""
    marks = pytestmark if isinstance(pytestmark, list) else [pytestmark]
    for m in marks:
        if getattr(m, "name", None) == "drives" and m.args:
            return frozenset(int(i) for i in m.args)
    return None


def lanes(hosts_of: dict[str, frozenset[int]]) -> dict[str, str]:
    """Each module's lane name (``lab-hosts-1,2``): the connected sets of their hosts."""
    merged: list[frozenset[int]] = []
    for hosts in hosts_of.values():
        touching = [m for m in merged if m & hosts]
        merged = [m for m in merged if not m & hosts] + [hosts.union(*touching)]
    name = {m: "lab-hosts-" + ",".join(map(str, sorted(m))) for m in merged}
    return {module: next(name[m] for m in merged if m & hosts)
            for module, hosts in hosts_of.items()}


def lab_modules() -> dict[str, frozenset[int]]:
    """Every lab module (its node-id path) and the hosts it drives, by importing it."""
    found: dict[str, frozenset[int]] = {}
    for path in sorted(LAB.glob("test_*.py")):
        module = importlib.import_module(f"tests.lab.{path.stem}")
        hosts = drives(getattr(module, "pytestmark", None))
        rel = path.relative_to(REPO).as_posix()
        if hosts is None:
            raise pytest.UsageError(f"{rel}: {UNMARKED}")
        found[rel] = hosts
    return found


class LaneScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a lab module's lane as its scope; every other test
    is a scope of its own. Scopes go out largest first, each to a free worker."""

    def __init__(self, config: pytest.Config, lane_of: dict[str, str],
                 log: Any = None) -> None:
        super().__init__(config, log)
        self.lane_of = lane_of

    def _split_scope(self, nodeid: str) -> str:
        return self.lane_of.get(nodeid.split("::", 1)[0], nodeid)


def check_marked(items: Iterable[pytest.Item]) -> None:
    """A lab test whose module does not say its hosts is refused at collection."""
    for item in items:
        if item.get_closest_marker("drives") is None:
            raise pytest.UsageError(f"{item.path.name}: {UNMARKED}")
