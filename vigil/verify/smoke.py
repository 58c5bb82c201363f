"""The smoke test: one real, streamed completion through the OpenAI API on the host.

`/health` 200 proves only that the HTTP server is up: a real start on this machine
answered 200 and died on its first request. So `ready` needs tokens back. The request
runs ON the host (the agent's `smoke` verb, one SSH round trip), so it needs no open port
between the operator and the host. The API key travels on stdin with the request, never
on a command line (`ps` would show it).
"""

from __future__ import annotations

from typing import Any

from vigil.desired.config import ModelProfile
from vigil.verify.snapshot import Smoke

PROMPT = "The capital of France is"
MAX_TOKENS = 16


def served_name(profile: ModelProfile) -> str:
    return profile.served_model_name or profile.path


def request(model: str, port: int, api_key: str | None, *, timeout: float = 120.0,
            max_tokens: int = MAX_TOKENS, prompt: str = PROMPT) -> dict[str, Any]:
    """The agent's `smoke` request, sent on stdin: the only way the API key travels."""
    return {"model": model, "port": port, "api_key": api_key, "timeout": timeout,
            "max_tokens": max_tokens, "prompt": prompt}


def parse(data: dict[str, Any]) -> Smoke:
    """The agent's `smoke` reply as a `Smoke`."""
    return Smoke(
        ok=bool(data.get("ok")),
        tokens=int(data.get("tokens") or 0),
        ttft_s=data.get("ttft_s"),
        tokens_per_s=data.get("tokens_per_s"),
        error=data.get("error"),
    )
