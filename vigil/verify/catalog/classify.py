"""What one log line means: a marker, a fatal line with its cause, a wait, noise, the
serving line or a stop; and the remedy a cause gives for the values its line carries.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from vigil.verify.catalog.causes import CAUSE, CAUSES, VERDICT_REMEDIES, Cause
from vigil.verify.catalog.lines import Line, parse_line
from vigil.verify.catalog.phases import PHASE_RECORDS, Edge, Kind, Role, phase_index
from vigil.verify.catalog.waits import _RETRIES, WAITS, Wait

_HINTS: tuple[tuple[Cause, re.Pattern[str]], ...] = tuple(
    (c, re.compile("|".join(f"(?:{p})" for p in c.hints))) for c in CAUSES if c.hints)

# An exception line `pkg.mod.SomeError: message`, the last line of a traceback: the root
# of an unknown cause. Types raised while tearing down are not roots.
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))"
    # Ray re-raises a worker's exception as RayTaskError(ValueError): …
    r"(?:\([A-Z]\w*\))?(?::\s*(?P<text>.*))?$")

_TEARDOWN_TYPES = frozenset({"CancelledError", "KeyboardInterrupt", "SystemExit",
                             "BrokenPipeError", "ConnectionResetError", "GeneratorExit",
                             "ClosedResourceError"})

# Bounded repeats: unbounded ones make this quadratic on a long dotted frame line.
_FLATTENED = re.compile(r"\b(?:[a-z_]\w{0,40}\.){1,6}[A-Z]\w{0,60}(?:Error|Exception): ")

_FRAME_ANY = re.compile(r'^File "[^"]*", line \d+, in (?P<func>[\w<>]+)')

# Only vLLM's own frames: a wrapper's `load_model` (a demo, a framework) proves nothing.
_FRAME = re.compile(r'^File "[^"]*vllm[/\\][^"]*", line \d+, in (?P<func>[\w<>]+)')

# A V0 worker wrapper names the worker method that failed; the method is the frame
# (initialize_cache: the KV cache; load_model: the weights).
_WORKER_METHOD = re.compile(
    r"(?:Error executing method|while processing method) '?(?P<func>\w{1,80})")

# Process names in vLLM's prefix: an engine core or a worker exists, so the start is past
# bootstrap (`EngineCore_DP0`, `VllmWorker rank=0`, `Worker_TP1`, `RayWorkerWrapper`).
_PROC_PHASE = re.compile(r"^(?:EngineCore|VllmWorker|Worker|RayWorkerWrapper)")

# multiprocessing's header of a child's traceback: "Process EngineCore_0:"
_PROC_HEADER = re.compile(r"^Process (?:EngineCore|VllmWorker|Worker)\S*:$")

# CPython's BaseProcess._bootstrap writes "Process NAME:" and the traceback only when the
# child's target raised (SystemExit, vLLM's own signal exit, prints nothing): a vLLM
# process died. V0's engine process is a spawn child with the default "SpawnProcess-N".
CHILD_DIED = re.compile(r"^Process (?:EngineCore|VllmWorker|Worker|SpawnProcess)[\w-]{0,40}:$")

# Serving: requests answered, throughput stats, uvicorn bound. Access lines of any status:
# a 404 is an answer too.
_SERVING = re.compile(
    r'"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) /\S* HTTP/[\d.]+" \d{3}'
    r"|Avg prompt throughput: [0-9.]+ tokens/s"
    r"|Uvicorn running on (?:http|unix)"
    r"|Engine \d+: Avg prompt throughput"
    # an offline harness: `vllm bench throughput`'s result (LLM's own progress bar is
    # _OFFLINE_BAR)
    r"|Throughput: [0-9.]+ requests/s, [0-9.]+ (?:total )?tokens/s")

# An offline harness's progress (entrypoints/llm.py, 0.1 → 0.33): "Adding requests" while
# a batch is queued (0.8+), then "Processed prompts" counting finished requests. One
# finished request is serving evidence; a bar at N/N says the batch is done (the engine
# idle until the next one).
_OFFLINE_BAR = re.compile(
    r"(?P<bar>Processed prompts|Adding requests): {0,3}\d{1,3}%\|[^|]{0,80}\| {0,3}"
    r"(?P<done>\d{1,10})/(?P<total>\d{1,10})")

# An orderly stop. Its trigger: someone asked (systemd's stop job — "Stopping X"; systemd
# prints "Stopped X" on an automatic restart after a crash too —, a signal, Ctrl-C).
_STOP_TRIGGER = re.compile(
    r"^Stopping \S+(?:\.service)?\b|Received signal SIG(?:TERM|INT)|received SIG(?:TERM|INT)"
    r"|SIG(?:TERM|INT) received|received signal=SIG(?:TERM|INT)|^KeyboardInterrupt$|^\^C")

# vLLM's front end SIGTERMs its own engine core and workers while it tears down: their
# "received SIGTERM" is teardown; SIGINT (a terminal's Ctrl-C) reaches every process.
_CHILD_PROC = re.compile(r"^(?:EngineCore|Worker|VllmWorker|RayWorker)", re.IGNORECASE)

# Teardown: uvicorn's and vLLM's shutdown sequence. vLLM runs it after a crash too (a
# killed engine core: "[shutdown] Process manager: send sigterm …" before "Failed core
# proc(s)"), so on its own it is a stop only if no failure follows.
_STOP_TEARDOWN = re.compile(
    r"^INFO:\s+Shutting down$|^Shutting down$|Waiting for application shutdown"
    r"|Shutting down FastAPI HTTP server|\[shutdown\]"
    # the engine core honouring a shutdown request (core.py, 0.2x), and torch's
    # ProcessGroupNCCL destructor when the process exits without destroy_process_group
    r"|^Shutdown initiated \(timeout=\d+\)"
    r"|destroy_process_group\(\) was not called before program exit")

# vLLM's shared-memory broadcast notice, every wording (catalog.WAITS' shm_broadcast)
_NOISE = re.compile(r"No available (?:shared memory broadcast )?block ?found ?in "
                    r"(?P<seconds>\d+) seconds?\b")

# A KV budget of nothing: vLLM raises "No available memory for the cache blocks" right
# after logging it (V1 check_enough_kv_cache_memory when available_memory <= 0, after
# gpu_worker's "Available KV cache memory: -2.77 GiB"; V0 raise_if_cache_size_invalid
# when num_gpu_blocks <= 0, after the executor's "# GPU blocks: 0"). The number, not the
# wording, is the proof: the INFO level does not make the line advisory.
_KV_NONE = re.compile(r"Available KV cache memory: (?:-[0-9.]+|0(?:\.0+)?) ?GiB"
                      r"|# (?:GPU|CUDA|cuda) blocks: 0, # CPU blocks: \d+")

@dataclass(frozen=True)
class Match:
    """What one line means. `values` holds numbers pulled out of it (GiB, seconds…);
    `reached` the phase the line proves the start got to (a marker's phase, a traceback
    frame, an engine or worker process name); `role` a fatal line's place in the chain."""

    kind: Kind
    line: Line
    phase: str | None = None
    edge: Edge | None = None
    marker: str | None = None
    cause: str | None = None
    remedy: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    reached: str | None = None
    role: Role | None = None
    exception: str | None = None  # the exception type of an exception line
    stop: Literal["trigger", "teardown"] | None = None  # a stop line: asked for, or teardown
    wait: str | None = None  # a wait line's Wait id (kind "noise": alive, not progress)

def remedy_for(cause: str, values: Mapping[str, str] | None = None) -> str:
    """The remedy text for a cause (or a verdict), filled with values from the line."""
    v: dict[str, str] = dict(values or {})
    if "len0" in v and "len" not in v:
        v["len"] = v["len0"]
    v.setdefault("pkg", "cubin")
    v.setdefault("want", "<flashinfer-python version>")
    v.setdefault("have", "?")
    v["len_note"] = f" ({v['len']})" if v.get("len") else ""
    for alt in ("world1", "world2", "world3"):
        if alt in v and "world" not in v:
            v["world"] = v[alt]
    v["world_note"] = f" ({v['world']})" if v.get("world") else ""
    for alt in ("arch3", "arch4", "arch5"):
        if alt in v and "arch" not in v:
            v["arch"] = v[alt]
    v["arch_note"] = f" (sm_{v['arch']})" if v.get("arch") else ""
    v["cap_note"] = f" (compute capability {v['cap']})" if v.get("cap") else ""
    v["joined_note"] = (f" ({v['joined']} of {v['world']} joined)"
                        if v.get("joined") and v.get("world") else "")
    for alt in ("host2", "host3", "port2", "port3"):
        if alt in v and alt[:-1] not in v:
            v[alt[:-1]] = v[alt]
    v["store_note"] = f" at {v['host']}:{v['port']}" if v.get("host") and v.get("port") else ""
    rec = CAUSE.get(cause)
    template = rec.remedy if rec is not None else VERDICT_REMEDIES.get(
        cause, CAUSE["unknown"].remedy)
    return template.format_map(defaultdict(str, v))

def role_of(cause: str) -> Role:
    rec = CAUSE.get(cause)
    return rec.role if rec is not None else "chain"

def wraps_another(cause: str) -> bool:
    """A root whose exception wraps another one (torch.compile's): see `Cause.wraps`."""
    rec = CAUSE.get(cause)
    return rec is not None and rec.wraps

def is_specific(cause: str) -> bool:
    """A root cause (not a symptom, not a chain link)."""
    return role_of(cause) == "root"

def _floats(groups: dict[str, str | None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, raw in groups.items():
        if raw is None:
            continue
        try:
            out[key] = float(raw.replace(",", ""))
        except ValueError:
            continue
    return out

def is_traceback_link(text: str) -> bool:
    """A chain link proven by a traceback's shape (a dying child's header, a frame), which
    a KeyboardInterrupt closing that traceback turns into the stop's."""
    msg = parse_line(text).message
    return CHILD_DIED.match(msg) is not None or _FRAME_ANY.match(msg) is not None or \
        msg == "Traceback (most recent call last):"

def runs_in(msg: str) -> bool:
    """A line that names code that was running (a traceback frame, a V0 worker wrapper
    naming the method that failed): its phase is where the start still was, even after
    that phase's end marker."""
    return _FRAME_ANY.match(msg) is not None or _WORKER_METHOD.search(msg) is not None

# torch's CUDA graph capture (torch.cuda.graph's context, CUDAGraph.capture_begin/end):
# only vLLM's graph capture runs it at startup, so its frames prove the capture phase
# even where a paste keeps no vLLM frame below them (vllm#19186, #18446).
_TORCH_CAPTURE = re.compile(
    r'^File "[^"]{0,400}torch[/\\]cuda[/\\]graphs\.py", line \d+, in '
    r'(?:capture_begin|capture_end|__enter__|__exit__)\b')

# torch.distributed's rendezvous (init_process_group through the TCP store): at startup
# only vLLM's distributed init calls it, so its frames prove that phase where a paste keeps
# no vLLM frame (vllm-ascend#167, vllm#16334).
_TORCH_RENDEZVOUS = re.compile(
    r'^File "[^"]{0,400}torch[/\\]distributed[/\\](?:distributed_c10d|rendezvous)\.py", '
    r"line \d+, in (?:init_process_group|_tcp_rendezvous_handler|_create_c10d_store)\b")

# torch.compile's own log records (torch._logging's glog-style prefix names the module:
# "E0701 14:28:21.083000 911603 torch/_inductor/runtime/triton_heuristics.py:539] …"):
# at startup only vLLM's compile of the model runs Dynamo and Inductor (nixpkgs#406675).
_TORCH_COMPILE_SOURCE = ("torch/_inductor/", "torch/_dynamo/")


def _reached(line: Line, msg: str) -> str | None:
    if line.source is not None and line.source.startswith(_TORCH_COMPILE_SOURCE):
        return "compiling"
    if _TORCH_CAPTURE.match(msg):
        return "capturing_graphs"
    if _TORCH_RENDEZVOUS.match(msg):
        return "distributed_init"
    frame = _FRAME.match(msg) or _WORKER_METHOD.search(msg)
    if frame:
        func = frame.group("func")
        for p in reversed(PHASE_RECORDS):
            if func in p.frames:
                return p.name
    if (line.proc and _PROC_PHASE.match(line.proc)) or _PROC_HEADER.match(msg):
        return "engine_init"
    return None

def _wait_match(waits: tuple[Wait, ...], line: Line, reached: str | None) -> Match | None:
    """The first of `waits` this line reports (kind "noise": alive, never progress), at the
    later of its own phase and what the line proves."""
    for wait in waits:
        wm = wait.pattern.search(line.message)
        if wm:
            at = wait.reached or reached
            if reached is not None and at is not None and phase_index(reached) > phase_index(at):
                at = reached
            return Match("noise", line, values=_floats(wm.groupdict()), reached=at, wait=wait.id)
    return None

_ADVISORY = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})


def classify(text: str) -> Match:
    """Classify one raw log line (ANSI codes, vLLM prefix and paste wrappers allowed).

    A line vLLM logged below ERROR never ends a start: vLLM raises what is fatal and
    survives what it logs at DEBUG/INFO/WARNING (an optional communicator "not supported
    on capability 12.0", a placement-group shortfall it waits out). Such a line's cause may
    annotate a verdict (a hint), never decide it; death needs an ERROR, a traceback or the
    process's exit."""
    m = _classify(text)
    if m.kind == "fatal" and m.line.level in _ADVISORY:
        return Match("other", m.line, cause=m.cause, remedy=m.remedy, values=m.values,
                     reached=m.reached, role="hint")
    return m


def _classify(text: str) -> Match:
    line = parse_line(text)
    msg = line.message
    if not msg:
        return Match("other", line)
    reached = _reached(line, msg)
    noise = _NOISE.search(msg)
    if noise:
        return Match("noise", line, values=_floats(noise.groupdict()), reached=reached,
                     wait="shm_broadcast")
    frame = _FRAME_ANY.match(msg)
    if frame:
        for cause in CAUSES:
            if frame.group("func") in cause.frames:
                if cause.reached is not None and (
                        reached is None or phase_index(cause.reached) > phase_index(reached)):
                    reached = cause.reached
                return Match("fatal", line, cause=cause.id, remedy=remedy_for(cause.id),
                             reached=reached, role=cause.role)
    exc = _EXCEPTION.match(msg)
    exc_type = exc.group("type") if exc else None
    # A warning that only says flashinfer ignored a package is not fatal (≥0.7.2); a
    # frame line quotes source code, not an error, unless a paste flattened the traceback
    # onto one line: then its qualified exception (`requests.exceptions.X: …`) is there.
    text = msg
    if msg.startswith("File \""):
        flat = _FLATTENED.search(msg)
        text = msg[flat.start():] if flat else ""
    if _KV_NONE.search(msg):
        return Match("fatal", line, cause="kv_cache_too_small",
                     remedy=remedy_for("kv_cache_too_small"), reached="kv_cache",
                     role="root")
    # A retry quotes the error it met: the wait, not that error.
    if "retry" in msg or "client socket" in msg:
        retry = _wait_match(_RETRIES, line, reached)
        if retry is not None:
            return retry
    # vLLM raises what is fatal; what it logs at DEBUG/INFO/WARNING it survives (since
    # 0.6.5 the Ray placement-group shortfall is a warning, and vLLM waits for the GPUs).
    advisory = line.level in ("DEBUG", "INFO", "WARNING", "WARN")
    if "Ignoring incompatible flashinfer" not in msg and text and not advisory:
        for cause in CAUSES:
            fm = cause.regex.search(text)
            if fm:
                groups = {k: v for k, v in fm.groupdict().items() if v is not None}
                if cause.reached is not None and (
                        reached is None or phase_index(cause.reached) > phase_index(reached)):
                    reached = cause.reached
                return Match(
                    "fatal", line, cause=cause.id, remedy=remedy_for(cause.id, groups),
                    values=_floats(fm.groupdict()), reached=reached, role=cause.role,
                    exception=exc_type,
                )
    if "ait" in msg or "exceeds" in msg or "fulfill" in msg or "scheduled" in msg:
        waited = _wait_match(WAITS, line, reached)
        if waited is not None:
            return waited
    for cause, hint in _HINTS:
        if hint.search(msg):
            if cause.reached is not None and (
                    reached is None or phase_index(cause.reached) > phase_index(reached)):
                reached = cause.reached
            return Match("other", line, cause=cause.id, remedy=remedy_for(cause.id),
                         reached=reached, role="hint")
    if exc_type is not None and exc_type not in _TEARDOWN_TYPES and (
            line.level in (None, "ERROR", "CRITICAL")):
        return Match("fatal", line, cause="unknown", remedy=remedy_for("unknown"),
                     reached=reached, role="root", exception=exc_type)
    for phase in PHASE_RECORDS:
        for marker in phase.markers:
            mm = marker.pattern.search(msg)
            if mm:
                return Match(
                    "marker", line, phase=phase.name, edge=marker.edge, marker=marker.name,
                    values=_floats(mm.groupdict()), reached=phase.name,
                )
    bar = _OFFLINE_BAR.search(msg) if "%|" in msg else None
    if bar:  # an offline batch: how many of how many are done ("Adding": none yet)
        done = int(bar.group("done")) if bar.group("bar") == "Processed prompts" else 0
        values = {"done": float(done), "total": float(bar.group("total"))}
        if done:
            return Match("serving", line, reached="ready", marker="offline_batch",
                         values=values)
        return Match("other", line, reached=reached, marker="offline_batch", values=values)
    if _SERVING.search(msg):
        return Match("serving", line, reached="ready")
    if _STOP_TRIGGER.search(msg) or exc_type in ("KeyboardInterrupt",):
        child = (line.proc is not None and _CHILD_PROC.match(line.proc) is not None
                 and "SIGTERM" in msg)
        return Match("stop", line, reached=reached, stop="teardown" if child else "trigger")
    if _STOP_TEARDOWN.search(msg):
        return Match("stop", line, reached=reached, stop="teardown")
    return Match("other", line, reached=reached)
