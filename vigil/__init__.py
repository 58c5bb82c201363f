"""vigil: deploy vLLM as systemd services and verify that they came up."""
