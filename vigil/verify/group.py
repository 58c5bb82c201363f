"""One verdict for a node group, from each node's own reducer state (pure).

Each node's journal, processes and GPUs are folded by the single-host reducer; this
module only combines the states:

- the group's phase is its least advanced node's;
- in ``distributed_init`` it names the nodes that have joined (past it) and those missing;
- a crash on any node is the group's crash, naming the node (the earliest crash wins);
- a node that never joins is a stall in ``distributed_init`` naming it — whichever
  node's stall window ran out first (the head waits at its process-group barrier);
- ready is the head's verdict (its /health and a real completion) with every worker
  joined and alive; a worker has no HTTP server, so its own reducer never says ready
  and its idle quiet after loading is not a stall once the head serves.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING

from vigil.errors import VigilError
from vigil.report import open_new
from vigil.transport.base import Transport, privileged
from vigil.transport.ssh import connect
from vigil.verify import history
from vigil.verify.budgets import BudgetKey, Budgets
from vigil.verify.reducer import PHASES, TERMINAL, Verdict, WatchState, initial, step
from vigil.verify.snapshot import Smoke, Snapshot
from vigil.verify.watch import (
    Poller,
    ProbeTarget,
    Settings,
    plan_for,
    trace_path,
    with_stall,
)

if TYPE_CHECKING:
    from vigil.desired.config import HostVars
    from vigil.desired.engines.base import ClusterProbe
    from vigil.desired.groups import NodeGroup

JOIN_PHASE = "distributed_init"
RAY_CHECK_S = 10.0  # how often verify asks a Ray group's cluster


@dataclass(frozen=True)
class NodeView:
    name: str
    rank: int
    state: WatchState
    started: bool = True  # False: its unit is not running (inactive, no process)


@dataclass(frozen=True)
class GroupState:
    phase: str
    verdict: Verdict | None
    node: str | None  # the node the verdict is about (crash, stall, stop)
    cause: str | None
    proof: str | None
    remedy: str | None
    joined: tuple[str, ...]
    missing: tuple[str, ...]
    phases: Mapping[str, str]  # node -> its phase
    summary: str
    ray: RayJoin | None = None  # a Ray group's cluster at this decision


def _rank(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else 0


def _failed_at(st: WatchState) -> float:
    """When the node's failure was first seen (its earliest fatal line), else its last poll."""
    return min((f.at for f in st.fatal), default=st.now or 0.0)


# A rank that lost its peer (the peer died or was killed): the failure began elsewhere.
# gloo: "[…/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:9868"
# (the lab's PP=2 head when its worker was SIGKILLed); NCCL/TCPStore: reset/broken pipe.
PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe|remote process exited")
# How long a node that lost a peer waits for the origin's own lines before it is named.
PEER_GRACE_S = 15.0


def _peer_lost(st: WatchState) -> bool:
    live = [f for f in st.fatal if not f.after_stop]
    return any(PEER_LOST.search(f.proof) for f in live) or (
        st.verdict == Verdict.CRASHED and st.proof is not None and bool(PEER_LOST.search(st.proof)))


@dataclass(frozen=True)
class RayJoin:
    """A Ray group's cluster as Ray's own API on the head shows it (``ray.nodes()``)."""

    alive: int | None  # None: the cluster did not answer (not up yet, or down)
    expected: int
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.alive is not None and self.alive >= self.expected


def has_joined(v: NodeView) -> bool:
    """Past distributed_init: its ranks are in the process groups."""
    if not v.started:
        return False
    return v.state.verdict == Verdict.READY or _rank(v.state.phase) > _rank(JOIN_PHASE)


def group_state(nodes: Sequence[NodeView], ray: RayJoin | None = None) -> GroupState:
    """``ray``: a Ray group's cluster; its nodes join the cluster, not vLLM's ranks (vLLM
    runs on the head only), so ready also needs every Ray node alive. Every summary of a
    Ray group ends with the cluster's count."""
    gs = _group_state(nodes, ray)
    if ray is None:
        return gs
    alive = "?" if ray.alive is None else str(ray.alive)
    return replace(gs, ray=ray, summary=f"{gs.summary}; ray: {alive}/{ray.expected} "
                   "nodes alive")


def _group_state(nodes: Sequence[NodeView], ray: RayJoin | None) -> GroupState:
    if not nodes:
        raise ValueError("a group has nodes")
    ordered = sorted(nodes, key=lambda v: v.rank)
    head = ordered[0]
    phases = {v.name: (v.state.phase if v.started else "not running") for v in ordered}
    least = min(ordered, key=lambda v: _rank(v.state.phase) if v.started else -1)
    phase = least.state.phase if least.started else "bootstrap"
    joined = tuple(v.name for v in ordered if has_joined(v))
    missing = tuple(v.name for v in ordered if not has_joined(v))

    def done(verdict: Verdict, node: NodeView | None, cause: str | None, proof: str | None,
             remedy: str | None, summary: str, at_phase: str | None = None) -> GroupState:
        return GroupState(at_phase or phase, verdict, node.name if node else None, cause,
                          proof, remedy, joined, missing, phases, summary)

    crashed = [v for v in ordered if v.started and v.state.verdict == Verdict.CRASHED]
    if crashed:
        # The origin is the node that failed on its own. A killed peer reaches the others
        # as their own errors ("Connection closed by peer"), often logged and judged
        # before the origin's own lines (its main process waits for its ranks first).
        failing = [v for v in ordered if v.started and (
            v.state.verdict == Verdict.CRASHED or any(not f.after_stop for f in v.state.fatal))]
        own = [v for v in failing if not _peer_lost(v.state)]
        if not own:
            seen = max((v.state.now or 0.0) for v in ordered if v.started)
            quiet = [v.name for v in ordered if v.started and v not in failing]
            if quiet and seen - min(_failed_at(v.state) for v in failing) < PEER_GRACE_S:
                return GroupState(
                    phase, None, None, None, None, None, joined, missing, phases,
                    f"{', '.join(v.name for v in failing)} lost a peer; waiting for the "
                    f"origin's own failure ({', '.join(quiet)})")
        first = min(own or failing, key=lambda v: (_failed_at(v.state), v.rank))
        st = first.state
        if st.verdict == Verdict.CRASHED:
            cause, proof, remedy = st.cause, st.proof, st.remedy
        else:
            f = min((f for f in st.fatal if not f.after_stop), key=lambda f: f.at)
            cause, proof, remedy = f.cause, f.proof, f.remedy
        after = [v.name for v in crashed if v is not first]
        also = f"; then {', '.join(after)}" if after else ""
        return done(Verdict.CRASHED, first, cause, f"{first.name}: {proof}", remedy,
                    f"crashed on node {first.name} ({cause}) in {st.phase}{also}",
                    at_phase=st.phase)
    stopped = [v for v in ordered if v.started and v.state.verdict == Verdict.STOPPED]
    if stopped:
        v = stopped[0]
        return done(Verdict.STOPPED, v, None, f"{v.name}: {v.state.proof}", None,
                    f"node {v.name} was stopped", at_phase=v.state.phase)
    workers_up = all(has_joined(v) for v in ordered[1:]) and (ray is None or ray.complete)
    if head.state.verdict == Verdict.READY and workers_up:
        return done(Verdict.READY, None, None, head.state.proof, None,
                    f"ready: {len(ordered)} nodes joined, served through {head.name}",
                    at_phase="ready")
    ended = [v for v in ordered
             if v.started and v.state.verdict in (Verdict.STALLED, Verdict.TIMED_OUT)
             and not (v.rank > 0 and has_joined(v))]  # a joined worker may sit idle
    if ended:
        v = min(ended, key=lambda x: (x.state.now or 0.0, x.rank))
        if _rank(v.state.phase) <= _rank(JOIN_PHASE) and missing:
            # the workers join the head: name the missing workers, else the head
            absent = [m for m in missing if m != head.name] or [head.name]
            never = [m for m in absent if not next(x for x in ordered if x.name == m).started]
            why = f" ({', '.join(never)}: unit not running)" if never else ""
            return done(
                Verdict.STALLED, next(x for x in ordered if x.name == absent[0]),
                f"stalled_{JOIN_PHASE}",
                f"{v.name} waited in {JOIN_PHASE}; not joined: {', '.join(absent)}{why}",
                f"start or fix the missing node(s): invoke logs --hosts {absent[0]}; "
                "check that they reach the head's master address and port",
                f"stalled in {JOIN_PHASE}: missing {', '.join(absent)}",
                at_phase=JOIN_PHASE)
        st = v.state
        return done(st.verdict or Verdict.STALLED, v, st.cause, f"{v.name}: {st.proof}", st.remedy,
                    f"{st.verdict} on node {v.name} in {st.phase}", at_phase=st.phase)
    never = [v.name for v in ordered if not v.started]
    if phase == JOIN_PHASE or (missing and _rank(head.state.phase) >= _rank(JOIN_PHASE)):
        summary = (f"{JOIN_PHASE}: joined {', '.join(joined) or 'none'}; "
                   f"missing {', '.join(missing)}")
    else:
        summary = f"{phase} (least advanced: {least.name})"
    if never:
        summary += f"; not running: {', '.join(never)}"
    return GroupState(phase, None, None, None, None, None, joined, missing, phases, summary)


def group_key(head_key: BudgetKey, layout_label: str) -> BudgetKey:
    """A group's history key: the head's, with the layout in the hardware, so a 2-node
    PP=2 start never shares budgets with a single-host start of the same model."""
    return replace(head_key, hardware=f"{layout_label} x {head_key.hardware}")


# -- the shell: poll every node, fold each, decide once -----------------------------------


def not_started(snap: Snapshot) -> bool:
    """The node's unit is not running (never started, or ended before the watch): its
    journal holds only an earlier run, which is not this start's to judge."""
    u = snap.unit
    return u is not None and u.error is None and u.active_state in ("inactive", "failed") \
        and not u.main_pid


@dataclass
class GroupWatch:
    """Per-node states over a watch; the trace of group states as they were decided."""

    nodes: dict[str, NodeView]
    history: list[GroupState]


def watch_group(
    probes: Mapping[str, Callable[[str | None], Snapshot]],
    ranks: Mapping[str, int],
    run_smoke: Callable[[], Smoke],
    budgets: Budgets,
    *,
    poll_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_poll: Callable[[GroupState], None] | None = None,
    deadline_s: float | None = None,
    traces: Mapping[str, IO[str]] | None = None,
    ray_check: Callable[[], RayJoin] | None = None,
) -> GroupWatch:
    """Poll every node once per round, fold its snapshot through its own reducer, and
    stop at the group's terminal verdict. The smoke goes to the head only, once its
    /health answers. A node whose unit is not started is probed on but not folded (a
    unit that never ran has no start to judge)."""
    head = min(ranks, key=lambda n: ranks[n])
    views = {n: NodeView(n, ranks[n], initial(), started=False) for n in probes}
    cursors: dict[str, str | None] = {n: None for n in probes}
    out = GroupWatch(views, [])
    begin = clock()
    while True:
        started = clock()
        for name, probe in probes.items():
            snap = probe(cursors[name])
            view = views[name]
            if not view.started and not_started(snap):
                continue
            st = view.state
            if name == head and st.verdict not in TERMINAL and (
                    st.health_ok or (snap.http is not None and snap.http.health_status == 200)):
                snap = snap.model_copy(update={"smoke": run_smoke()})
            if st.verdict not in TERMINAL:
                st = step(st, snap, budgets)
                if traces is not None and name in traces:  # the node's own replayable trace
                    traces[name].write(snap.to_json() + "\n")
                    traces[name].flush()
            views[name] = NodeView(name, ranks[name], st, started=True)
            if snap.journal.cursor:
                cursors[name] = snap.journal.cursor
        gs = group_state(list(views.values()), ray_check() if ray_check else None)
        out.history.append(gs)
        if on_poll is not None:
            on_poll(gs)
        if gs.verdict is not None:
            return out
        if deadline_s is not None and clock() - begin > deadline_s:
            return out
        sleep(max(poll_s - (clock() - started), 0.0))


def verify_group(
    group: NodeGroup,
    settings: Settings,
    *,
    state_dir: Path | None = None,
    on_poll: Callable[[GroupState], None] | None = None,
    deadline_s: float | None = None,
    on_note: Callable[[str], None] | None = None,
) -> GroupWatch:
    """Watch a node group's start over one connection per node: every node's journal,
    processes and GPUs, one verdict. With ``state_dir`` the budgets come from the history
    of this group's layout (the head's key with the layout in it) and the start is
    recorded there and on the head; else the phase defaults (or --stall). ``on_note``
    gets one line per history record ignored (a line of the head's file, a mirror row)."""
    budgets = with_stall(Budgets(), settings.stall_s)
    with ExitStack() as stack:
        probes = {}
        transports = {}
        head_poller: Poller | None = None
        # a Ray group's workers run no vLLM: they join the Ray cluster (ray_check)
        for node in (n for n in group.nodes if n.serves):
            t = node.target
            transport = stack.enter_context(connect(t.name, t.vars))
            transports[node.name] = transport
            target = ProbeTarget.of(t, settings.max_lines)
            poller = Poller(transport, target,
                            partial(_privileged, host=t.vars, transport=transport), settings)
            probes[node.name] = poller.probe
            if node.rank == 0:
                head_poller = poller
        assert head_poller is not None
        head = group.head.target
        key = mirror = None
        if state_dir is not None:
            mirror, cores = history.history_in(transports[head.name], head.vars, state_dir,
                                               warn=on_note)
            # a group start is judged cold: the layout's history is its own
            key = group_key(history.budget_key(head.vars, head.profile, head.stack,
                                               head.rendered, "cold", cores),
                            group.layout.label)
            budgets = plan_for(head, key, mirror.records(), settings,
                               head.gpus_needed or 1).budgets
            if on_note is not None:
                for line in mirror.warnings:
                    on_note(line)
        traces = None
        if state_dir is not None:
            traces = {n: stack.enter_context(_open(trace_path(state_dir, n))) for n in probes}
        ray_check = None
        probe = group.engine.cluster_probe(group.spec, group.master_addr)
        if probe is not None:
            ray_check = every(RAY_CHECK_S, partial(_ray_join, transports[head.name], group,
                                                   probe))
        out = watch_group(probes, {n.name: n.rank for n in group.nodes if n.serves},
                          head_poller.smoke, budgets,
                          poll_s=settings.poll_for(head.vars.poll_s),
                          on_poll=on_poll, deadline_s=deadline_s, traces=traces,
                          ray_check=ray_check)
        final = out.history[-1]
        st = out.nodes[head.name].state
        rec = history.start_record(key, st, host=head.name, verdict=final.verdict,
                                   cause=final.cause, profile=head.profile,
                                   gpu_count=head.gpus_needed or 1) \
            if key is not None and final.verdict is not None else None
        if mirror is not None and rec is not None:  # the stage after the group's verdict
            history.record(transports[head.name], head.vars, mirror, rec)
        return out


def _ray_join(transport: Transport, group: NodeGroup, probe: ClusterProbe) -> RayJoin:
    """The engine's cluster probe on the head, with the group's environment."""
    t = group.head.target
    command = privileged(
        f"{shlex.quote(t.rendered.paths.python)} -c {shlex.quote(probe.script)} "
        f"{shlex.quote(probe.arg)}", t.vars, transport)
    try:
        r = transport.run(command, timeout=120)
    except VigilError as exc:
        return RayJoin(None, len(group.nodes), str(exc))
    err = None if r.exit_status == 0 else (r.stderr.strip()[-300:] or f"exit {r.exit_status}")
    return RayJoin(group.engine.alive_nodes(r.stdout), len(group.nodes), err)


def every(seconds: float, check: Callable[[], RayJoin],
          clock: Callable[[], float] = time.monotonic) -> Callable[[], RayJoin]:
    """``check`` at most once per ``seconds`` (each costs a Python start and a Ray client
    on the head's cores); the last answer in between."""
    last: list[tuple[float, RayJoin]] = []

    def cached() -> RayJoin:
        now = clock()
        if not last or now - last[0][0] >= seconds:
            last[:] = [(now, check())]
        return last[0][1]
    return cached


def _privileged(command: str, host: HostVars, transport: Transport) -> str:
    return privileged(command, host, transport)


def _open(path: Path) -> IO[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open_new(path)
