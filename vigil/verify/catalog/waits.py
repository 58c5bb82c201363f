"""Waits that can never end: one ``Wait`` record each (what it waits for, the phase it
proves, the cause it names when it outlasts its window, who logs it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Wait:
    """A wait the log reports: vLLM, Ray or torch.distributed waiting for what only the
    cluster or another process can give. Its line repeats while nothing moves, so it
    proves the process alive, never progress; when the wait never ends, `cause` names
    why (None: the line names nothing)."""

    id: str
    what: str  # for people: "a Ray placement group"
    pattern: re.Pattern[str]
    cause: str | None = None
    reached: str | None = None  # the phase the wait proves the start got to
    # The line quotes the error it retries after (torch's TCPStore client): it is the wait
    # whatever that error says, and only the give-up or the process's exit ends the start.
    retries: bool = False
    source: str = ""  # for people: who logs it, where, since when

WAITS: tuple[Wait, ...] = (
    # ray_utils._wait_until_pg_ready, every 10 s until PG_WAIT_TIMEOUT (1800 s): "Waiting
    # for creating a placement group of specs for 150 seconds. specs=[…]" (0.5 → 0.33)
    Wait("ray_placement_group", "a Ray placement group",
         re.compile(r"Waiting for creating a placement group of specs for (?P<waited>\d+) "
                    r"seconds"),
         cause="not_enough_gpus", reached="engine_init",
         source="vLLM ray_utils._wait_until_pg_ready, INFO every 10 s until "
                "PG_WAIT_TIMEOUT (0.5 → 0.33)"),
    # ray_utils before that wait, a WARNING since 0.6.5 (vllm#11138: it waits instead of
    # raising): "The number of required GPUs exceeds the total number of available GPUs in
    # the placement group"; 0.11+ "Tensor parallel size (16) exceeds available GPUs (8)"
    Wait("ray_gpu_shortfall", "GPUs the Ray cluster does not have",
         re.compile(r"The number of required GPUs exceeds the total number of available GPUs "
                    r"in the placement group|Tensor parallel size \(\d+\) exceeds available "
                    r"GPUs \(\d+\)"),
         cause="not_enough_gpus", reached="engine_init",
         source="vLLM ray_utils, WARNING before the placement-group wait (0.6.5 →; 0.11+ wording)"),
    # Ray's autoscaler and scheduler on a request no node can satisfy (printed by Ray, not
    # vLLM: "Error: No available node types can fulfill resource request {'GPU': 1.0}",
    # "Warning: The following resource request cannot be scheduled right now")
    Wait("ray_infeasible", "GPUs no Ray node type offers",
         re.compile(r"No available node types can fulfill resource request"
                    r"|The following resource request cannot be scheduled right now"),
         cause="not_enough_gpus",
         source="Ray's autoscaler and scheduler"),
    # V1 front end, wait_for_engine_startup (v1/engine/utils.py, 0.9+) at DEBUG every 10 s:
    # "Waiting for 1 local, 0 remote core engine proc(s) to start." A remote engine is a
    # data-parallel rank on another node that has not connected; a local one is an engine
    # core still starting (its own lines say how far)
    Wait("dp_remote_engines", "a data-parallel rank on another node",
         re.compile(r"Waiting for \d+ local, [1-9]\d* remote core engine proc\(s\) to start"),
         cause="distributed_init_timeout", reached="engine_init",
         source="vLLM v1/engine/utils.py wait_for_engine_startup, DEBUG every 10 s (0.9 →)"),
    Wait("engine_cores", "the engine core process",
         re.compile(r"Waiting for (?:\d+ local, \d+ remote |\d+ )?core engine proc\(s\) to "
                    r"start"),
         reached="engine_init",
         source="vLLM v1/engine/utils.py wait_for_engine_startup, DEBUG every 10 s (0.9 →)"),
    # a data-parallel engine core, once it is up, waits for the DP coordinator to say all
    # ranks are (EngineCoreProc's handshake, INFO, once): a rank that never comes up keeps
    # every other one here
    Wait("dp_coordinator_ready", "the other data-parallel ranks (the DP coordinator's READY)",
         re.compile(r"Waiting for READY message from DP Coordinator"),
         cause="distributed_init_timeout",
         source="vLLM EngineCoreProc's data-parallel handshake, INFO once"),
    # torch.distributed: the store-based barrier (distributed_c10d._store_based_barrier,
    # INFO, "Waiting in store based barrier to initialize process group for rank: 0, key:
    # … (world_size=2, num_workers_joined=1, timeout=0:30:00)")
    Wait("store_barrier", "the other ranks of the process group",
         re.compile(r"Waiting in store based barrier to initialize process group"),
         cause="distributed_init_timeout", reached="distributed_init",
         source="torch distributed_c10d._store_based_barrier, INFO"),
    # A TCPStore client connecting to the master rank's store (c10d socket.cpp and
    # TCPStore.cpp). Since torch 2.5 (pytorch#129261) TCPStore retries the whole connect
    # until its own timeout: each attempt that times out logs the socket's "[E… socket.cpp:N]
    # [c10d] The client socket has timed out after 600000ms while trying to connect to (H,
    # P)." (C10D_ERROR, then a throw that TCPStore catches) and then its WARNING "TCP client
    # failed to connect/validate to host H:P - retrying (try=0, …): <that error>", and waits
    # a full timeout again (trl#4538, vllm#19670's "try=1"). While nothing listens yet: "The
    # server socket on … has timed out, will retry." (vllm-metal#58), "No socket on (H, P) is
    # listening yet, will retry", torch ≤ 2.1's "[W socket.cpp:N] [c10d] The client socket has
    # failed to connect to H:P (errno: 110 - Connection timed out)." (vllm#3771, #2427) and
    # its "… to any network address of (H, P)." (logged, then thrown). Only TCPStore's "-
    # timed out (try=N, …)" or the exception the process dies of ends it.
    Wait("store_connect", "the process group's store on the master rank (TCPStore)",
         re.compile(r"(?:^\[[A-Z]\d{0,4}[^\]]{0,60}\] |\[c10d\] )The client socket has timed out "
                    r"after "
                    r"|TCP client failed to connect/validate to host \S{1,200} - retrying"
                    r"|The server socket on \S{1,200} (?:has timed out|is not yet listening)"
                    r"[^,]{0,80}, will retry"
                    r"|No socket on \([^)]{1,200}\) is listening yet, will retry"
                    r"|\[c10d\] The client socket has failed to connect to "),
         cause="distributed_init_timeout", reached="distributed_init", retries=True,
         source="torch c10d socket.cpp and TCPStore.cpp (TCPStore's retries: torch 2.5 →)"),
    # vLLM's shared-memory broadcast (distributed/device_communicators/shm_broadcast.py,
    # MessageQueue.acquire_write/acquire_read): the engine's writer waits for its workers to
    # read (or a worker for the writer), and says so every VLLM_RINGBUFFER_WARNING_INTERVAL
    # (60 s) of one wait: 0.5.1-0.6 WARNING "No available block found in 60 second. ",
    # 0.6-0.7 DEBUG "No available shared memory broadcast block found in 60 second." (the
    # reader's copy lacked a space: "…block foundin 60 second."), 0.8+ INFO "… found in 60
    # seconds. This typically happens when some processes are hanging or doing some
    # time-consuming work (e.g. compilation[, weight/kv cache quantization])." The k-th notice
    # of one wait means k intervals waited; another process's progress ends it.
    Wait("shm_broadcast", "another process to read or write vLLM's shared-memory broadcast",
         re.compile(r"No available (?:shared memory broadcast )?block ?found ?in "
                    r"(?P<interval>\d+) seconds?\b"),
         source="vLLM shm_broadcast.py MessageQueue.acquire_write/acquire_read, every "
                "VLLM_RINGBUFFER_WARNING_INTERVAL of one wait (0.5.1 →)"),
    # V0 front end (MQLLMEngineClient's output loop, 0.6 → 0.10) at DEBUG every
    # VLLM_RPC_TIMEOUT while no output comes: while the engine starts or sits idle alike
    Wait("v0_engine_output", "output from the engine process",
         re.compile(r"Waiting for output from MQLLMEngine"),
         source="vLLM V0 MQLLMEngineClient's output loop, DEBUG every VLLM_RPC_TIMEOUT "
                "(0.6 → 0.10)"),
)

WAIT: Mapping[str, Wait] = {w.id: w for w in WAITS}

_RETRIES: tuple[Wait, ...] = tuple(w for w in WAITS if w.retries)
