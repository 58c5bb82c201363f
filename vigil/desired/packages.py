"""Package names and versions as pip and the agent's listing spell them (pure).

The stack engine and the lock both key packages by these names and compare these
versions, so each rule is written once here.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version


def normalize(name: str) -> str:
    """PEP 503 name: what the agent's listing uses as keys."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """The version without its local part: 0.6.4+cu129 -> 0.6.4 (what must match)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def same_version(a: str, b: str) -> bool:
    """Equal as versions (2.10 == 2.10.0); as text where one is not a version."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b
