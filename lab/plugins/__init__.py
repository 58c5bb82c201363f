"""vLLM plugins for lab hosts only (lab/stall.py installs them; a deploy never does)."""
