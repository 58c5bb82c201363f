"""Unit tests: no lab host, no network; this machine only."""
