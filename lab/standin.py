"""A stand-in for a vLLM server, for scale tests only (never a product path).

32 real vLLM servers do not fit on a 2-core lab machine, so fleet tests run this under
the same systemd unit shape: ``lab/fleet.py`` packs it into a wheel whose
``vllm.entrypoints.openai.api_server`` runs ``main()``, and vigil's own deploy installs
that wheel into the service environment. It then

* writes a recorded real vLLM start (a lab trace's journal: the lines and their real
  offsets, each labelled with the phase vigil's reducer gave it) to stdout, which
  systemd puts in the journal; ``STANDIN_SPEED`` scales the offsets (0.05 = 20x faster);
* listens on ``--port`` where the recording does ("Starting vLLM server on ...") and
  answers ``/health`` 200 once it says "Application startup complete.";
* serves ``/v1/completions`` (streamed or not) and ``/v1/models``;
* crashes (exit 1) or stalls (alive, silent) at the start of the phase named by
  ``STANDIN_CRASH_AT`` / ``STANDIN_STALL_AT``;
* on SIGTERM behaves like vLLM with ``--shutdown-timeout=N``: stops accepting
  connections, lets requests in flight finish for up to N seconds (0: aborts them).

Standard library only: it runs with the host's python3 inside the service environment.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LISTEN_MARK = "Starting vLLM server on"
READY_MARK = "Application startup complete."
WORDS = ["Paris.", "It", "is", "the", "largest", "city", "in", "France", "and", "one", "of",
         "the", "most", "visited", "places", "in", "the", "world,", "known", "for"]


class State:
    def __init__(self, args: dict[str, str]) -> None:
        self.args = args
        self.model = args.get("served-model-name") or args.get("model") or "standin"
        self.ready = False
        self.in_flight = 0
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.stopping = False
        self.token_s = float(os.environ.get("STANDIN_TOKEN_S", "0.05"))


def parse_args(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for word in argv:
        if word.startswith("--"):
            name, _, value = word[2:].partition("=")
            out[name] = value
    return out


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    server_version = "standin"
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, format: str, *args: Any) -> None:
        pass  # vLLM runs with the access log off for /health: keep the journal the recording

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        st = self.state
        if self.path == "/health":
            self._json(200 if st.ready else 503, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": st.model, "object": "model"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        st = self.state
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "body is not JSON"}})
            return
        if self.path != "/v1/completions":
            self._json(404, {"error": "not found"})
            return
        if not st.ready:
            self._json(503, {"error": {"message": "not ready"}})
            return
        if req.get("model") != st.model:
            missing = req.get("model")
            self._json(404, {"error": {"message": f"The model `{missing}` does not exist."}})
            return
        with st.lock:
            st.in_flight += 1
        try:
            self._complete(req)
        finally:
            with st.lock:
                st.in_flight -= 1
                st.idle.notify_all()

    def _complete(self, req: dict[str, Any]) -> None:
        st = self.state
        n = max(1, int(req.get("max_tokens") or 16))
        words = [WORDS[i % len(WORDS)] for i in range(n)]
        rid = f"cmpl-standin-{time.monotonic_ns()}"
        if not req.get("stream"):
            time.sleep(st.token_s * n)
            self._json(200, {"id": rid, "object": "text_completion", "model": st.model,
                             "choices": [{"index": 0, "text": " " + " ".join(words),
                                          "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                       "total_tokens": 5 + n}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def event(body: Any) -> None:
            data = body if isinstance(body, str) else json.dumps(body)
            self.wfile.write((f"data: {data}\n\n").encode())
            self.wfile.flush()

        for word in words:
            time.sleep(st.token_s)
            event({"id": rid, "object": "text_completion", "model": st.model,
                   "choices": [{"index": 0, "text": " " + word, "finish_reason": None}]})
        if (req.get("stream_options") or {}).get("include_usage"):
            event({"id": rid, "object": "text_completion", "model": st.model, "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": n,
                             "total_tokens": 5 + n}})
        event("[DONE]")


def load_script() -> list[dict[str, Any]]:
    path = os.environ.get("STANDIN_SCRIPT") or os.path.join(os.path.dirname(__file__),
                                                            "script.json")
    with open(path) as fh:
        return list(json.load(fh)["lines"])


def serve(st: State, port: int, host: str) -> ThreadingHTTPServer:
    Handler.state = st
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    st = State(args)
    speed = float(os.environ.get("STANDIN_SPEED", "1"))
    crash_at = os.environ.get("STANDIN_CRASH_AT") or None
    stall_at = os.environ.get("STANDIN_STALL_AT") or None
    shutdown_timeout = int(args.get("shutdown-timeout") or 0)
    port = int(args.get("port") or 8000)
    host = args.get("host") or "0.0.0.0"
    server: list[ThreadingHTTPServer] = []
    stop = threading.Event()

    def on_term(_sig: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    start = time.monotonic()
    stalled = False
    for line in load_script():
        if line.get("phase") == crash_at:
            say(f"stand-in: told to crash at the start of phase {crash_at}")
            sys.exit(1)
        if line.get("phase") == stall_at:
            say(f"stand-in: told to stall at the start of phase {stall_at}")
            stalled = True
            break
        wait = start + float(line["t"]) * speed - time.monotonic()
        if wait > 0 and stop.wait(wait):
            break
        if stop.is_set():
            break
        if LISTEN_MARK in line["text"] and not server:
            try:
                server.append(serve(st, port, host))
            except OSError as exc:
                say(f"ERROR: [Errno {exc.errno or 0}] error while attempting to bind on "
                    f"address {(host, port)!r}: {exc.strerror}")
                sys.exit(1)
        say(line["text"].replace("0.0.0.0:8000", f"{host}:{port}"))
        if READY_MARK in line["text"]:
            st.ready = True
    if not stop.is_set() and not server and not stalled:
        server.append(serve(st, port, host))
        st.ready = True
    stop.wait()
    # vLLM's drain: no new connections; requests in flight get up to shutdown_timeout
    mode = "abort" if shutdown_timeout == 0 else "drain"
    say(f"[shutdown] API server: stopping engine client mode={mode} timeout={shutdown_timeout}s")
    for s in server:
        s.shutdown()
        s.server_close()  # connections are refused from here on
    deadline = time.monotonic() + shutdown_timeout
    with st.lock:
        while st.in_flight and time.monotonic() < deadline:
            st.idle.wait(deadline - time.monotonic())
        left = st.in_flight
    if left:
        say(f"[shutdown] aborting {left} request(s) in flight")
    say("[shutdown] API server: engine client stopped")
    sys.stdout.flush()
    os._exit(0)  # handler threads may be mid-write: leave now, like an aborted engine


if __name__ == "__main__":
    main()

