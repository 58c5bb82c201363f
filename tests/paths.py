"""Where the tests find the repository and their fixtures, from any folder below tests/."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
TRACES = FIXTURES / "traces"
