"""The ``lab_hosts`` fixture: real lab hosts for the whole test session.

Import it in conftest.py (``from tests.lab_fixtures import lab_hosts``). Hosts that
were already running stay running afterwards; hosts this session booted are powered
off at its end, so a developer's own lab is never taken away by a test run (under
pytest-xdist they stay up: `invoke lab.down` ends them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lab import hosts

# Two hosts cover "several hosts at once" and cost ~10 s of boot in parallel.
LAB_HOSTS = int(os.environ.get("VIGIL_LAB_HOSTS", "2"))


@pytest.fixture(scope="session")
def lab_hosts() -> Iterator[list[hosts.HostStatus]]:
    before = {h.name for h in hosts.status() if h.running}
    # Hosts already running are left as they are; only the ones booted here start clean.
    started = hosts.up(LAB_HOSTS)
    yield started[:LAB_HOSTS]
    ours = [h.name for h in started if h.name not in before]
    # Under pytest-xdist another worker may still use them: leave them up there.
    if ours and not os.environ.get("PYTEST_XDIST_WORKER"):
        hosts.down(ours)
