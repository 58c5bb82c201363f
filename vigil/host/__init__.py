"""The host side: the stdlib-only agent, one module per verb family, joined into one
script for the wire (payload.py) and piped to the host's python3."""
