"""The smoke test: one real, streamed completion through the OpenAI API on the host.

`/health` 200 proves only that the HTTP server is up: a real start on this machine
answered 200 and died on its first request. So `ready` needs tokens back. The request
runs ON the host (a stdlib snippet via `python3 -c`, one SSH round trip), so it needs
no open port between the operator and the host. The API key travels on stdin with the
request, never on a command line (`ps` would show it).
"""

from __future__ import annotations

import json
import shlex

from vigil.desired.config import HostVars, ModelProfile
from vigil.errors import HostError
from vigil.transport.ssh import Transport
from vigil.verify.snapshot import Smoke

PROMPT = "The capital of France is"
MAX_TOKENS = 16

# Runs on the host with any python3 >= 3.8; reads its request as JSON on stdin and
# prints one JSON line. Streams so time-to-first-token is measured, asks for usage in
# the last chunk so the token count is the server's, not a guess from chunk counts.
SOURCE = r'''
import json, sys, time, urllib.request, urllib.error
req = json.load(sys.stdin)
body = {"model": req["model"], "prompt": req["prompt"], "max_tokens": req["max_tokens"],
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
headers = {"Content-Type": "application/json"}
if req.get("api_key"):
    headers["Authorization"] = "Bearer " + req["api_key"]
url = "http://127.0.0.1:%d/v1/completions" % req["port"]
out = {"ok": False, "tokens": 0, "ttft_s": None, "tokens_per_s": None, "error": None,
       "status": None, "text": ""}
t0 = time.monotonic()
first = None
chunks = 0
usage = None
try:
    r = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(r, timeout=req["timeout"]) as resp:
        out["status"] = resp.status
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            msg = json.loads(data)
            if msg.get("error"):
                out["error"] = str(msg["error"])[:500]
                break
            for ch in msg.get("choices") or []:
                if ch.get("text"):
                    if first is None:
                        first = time.monotonic()
                    chunks += 1
                    out["text"] += ch["text"]
            if msg.get("usage"):
                usage = msg["usage"]
except urllib.error.HTTPError as exc:
    out["status"] = exc.code
    out["error"] = "HTTP %d: %s" % (exc.code, exc.read().decode("utf-8", "replace")[:500])
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
end = time.monotonic()
tokens = int((usage or {}).get("completion_tokens") or 0) or chunks
out["tokens"] = tokens
if first is not None:
    out["ttft_s"] = round(first - t0, 4)
    if tokens > 1 and end > first:
        out["tokens_per_s"] = round((tokens - 1) / (end - first), 2)
out["ok"] = out["error"] is None and tokens > 0
if out["ok"] is False and out["error"] is None:
    out["error"] = "the completion returned no tokens"
out["text"] = out["text"][:200]
print(json.dumps(out))
'''


def served_name(profile: ModelProfile) -> str:
    return profile.served_model_name or profile.path


def command() -> str:
    return f"python3 -c {shlex.quote(SOURCE)}"


def payload(model: str, port: int, api_key: str | None, *, timeout: float = 120.0,
            max_tokens: int = MAX_TOKENS, prompt: str = PROMPT) -> str:
    """The request, sent on stdin: the only way the API key travels."""
    return json.dumps({"model": model, "port": port, "api_key": api_key, "timeout": timeout,
                       "max_tokens": max_tokens, "prompt": prompt})


def parse(stdout: str, stderr: str = "", exit_status: int = 0) -> Smoke:
    """The snippet's JSON line as a `Smoke`; a snippet that died is a failed smoke."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.strip().startswith("{")), "")
    try:
        data = json.loads(line) if line else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = (stderr.strip().splitlines() or [f"exit {exit_status}, no output"])[-1]
        return Smoke(ok=False, error=f"smoke printed no result: {tail[:300]}")
    return Smoke(
        ok=bool(data.get("ok")),
        tokens=int(data.get("tokens") or 0),
        ttft_s=data.get("ttft_s"),
        tokens_per_s=data.get("tokens_per_s"),
        error=data.get("error"),
    )


def run(transport: Transport, host: HostVars, model: str, api_key: str | None,
        *, timeout: float = 120.0) -> Smoke:
    """Send one streamed completion from the host to its own server: one round trip."""
    try:
        res = transport.run(command(), stdin=payload(model, host.port, api_key, timeout=timeout),
                            timeout=timeout + 30)
    except HostError as exc:
        return Smoke(ok=False, error=f"smoke did not finish: {exc.message}")
    return parse(res.stdout, res.stderr, res.exit_status)
