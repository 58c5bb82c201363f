"""``smoke``: one real completion against the served model.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from vigil.host.common import Json, _err, _int, bearer

# -- smoke: one real streamed completion from the host to its own server -------------


def smoke(req: Json) -> Json:
    """Streams so time-to-first-token is measured; asks for usage in the last chunk so the
    token count is the server's, not a guess from chunk counts."""
    body = {"model": req["model"], "prompt": req["prompt"], "max_tokens": req["max_tokens"],
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    headers = dict(bearer(req.get("api_key")), **{"Content-Type": "application/json"})
    url = "http://127.0.0.1:%d/v1/completions" % _int(req["port"])
    out: Json = {"ok": False, "tokens": 0, "ttft_s": None, "tokens_per_s": None,
                 "error": None, "status": None, "text": ""}
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
        out["error"] = _err(exc)
    end = time.monotonic()
    tokens = _int((usage or {}).get("completion_tokens")) or chunks
    out["tokens"] = tokens
    if first is not None:
        out["ttft_s"] = round(first - t0, 4)
        if tokens > 1 and end > first:
            out["tokens_per_s"] = round((tokens - 1) / (end - first), 2)
    out["ok"] = out["error"] is None and tokens > 0
    if out["ok"] is False and out["error"] is None:
        out["error"] = "the completion returned no tokens"
    out["text"] = out["text"][:200]
    return out
