"""Shared fixtures: the real lab hosts (see tests/lab_fixtures.py)."""

from tests.lab_fixtures import lab_hosts

__all__ = ["lab_hosts"]
