"""The host side: stdlib-only programs piped to the host's python3 (agent verbs, probe)."""
