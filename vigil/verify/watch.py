"""The watcher: poll a starting vLLM service, fold snapshots through the reducer, say why.

Per host and poll: ONE round trip runs the host agent's `probe` verb and returns a
snapshot; the pure reducer folds it in. Once `/health` answers 200 the watcher sends a
real completion (smoke) in one more round trip and attaches its result to that
snapshot, so a trace replays to the same verdict. It stops at a terminal verdict.

Clock and sleep are injected (httpx-style) so the loop runs in tests at replay speed.
The reducer itself only ever sees the host's clock (snapshot times).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from vigil.errors import HostError, InternalError, VigilError
from vigil.exitcodes import ExitCode, worst
from vigil.report import open_new
from vigil.transport.base import Transport, privileged
from vigil.transport.remote import call_with
from vigil.transport.ssh import connect
from vigil.verify import compile_cache, history, predict, reducer, smoke, systemd
from vigil.verify.budgets import (
    MIN_SAMPLES,
    BudgetKey,
    BudgetPlan,
    Budgets,
    HistoryRecord,
    phase_defaults,
    plan_budgets,
)
from vigil.verify.snapshot import Smoke, Snapshot
from vigil.verify.stream import StreamProbe

if TYPE_CHECKING:
    from vigil.desired.config import HostVars
    from vigil.desired.targets import Target

Clock = Callable[[], float]
Sleep = Callable[[float], None]

# reducer.EXIT (vigil/verify/reducer/state.py): the documented exit code of each verdict.


@dataclass(frozen=True)
class Settings:
    # None: each host's poll_s (roles/verify/defaults.yml < inventory); --poll or
    # vigil.poll_s in the Invoke config set it for every host.
    poll_s: float | None = None
    probe_timeout_s: float = 60.0
    smoke_timeout_s: float = 120.0
    max_probe_failures: int = 3  # consecutive failed probes before the host counts as lost
    max_lines: int = 2000
    # Override every phase's stall window (seconds): for tests and impatient pipelines.
    stall_s: float | None = None
    # Successful starts needed before a key level's budgets come from history.
    min_samples: int = MIN_SAMPLES
    # Follow the host over one persistent channel (the agent's `stream` verb); False:
    # poll every poll_s. A host that cannot stream is polled anyway (said once).
    stream: bool = True

    def poll_for(self, host_poll_s: float) -> float:
        """The pause between polls, the one rule for every watch: --poll or vigil.poll_s
        for every host, else the host's own poll_s (the verify role's default, 5 s, <
        the inventory's)."""
        return self.poll_s if self.poll_s is not None else host_poll_s


@dataclass(frozen=True)
class ProbeTarget:
    """What the probe and the smoke need to know about one service."""

    unit: str
    port: int
    user: str
    cache_dir: str  # the service's VLLM_CACHE_ROOT
    python: str  # the service environment's python (NVML importable there)
    model: str  # served model name, for the smoke
    api_key: str | None = None
    max_lines: int = 2000

    def cache_dirs(self) -> tuple[str, str]:
        return self.cache_dir, f"/tmp/torchinductor_{self.user}"

    @classmethod
    def of(cls, t: Target, max_lines: int) -> ProbeTarget:
        """The service a deploy target renders (a host's, or a node group's node)."""
        return cls(unit=t.vars.service, port=t.vars.port, user=t.vars.service_user,
                   cache_dir=t.rendered.paths.cache, python=t.rendered.paths.python,
                   model=smoke.served_name(t.profile),
                   api_key=t.rendered.env.get("VLLM_API_KEY"), max_lines=max_lines)


def probe_request(t: ProbeTarget, cursor: str | None) -> dict[str, Any]:
    """The agent's `probe` request (on stdin: the API key never reaches a command line)."""
    return {"unit": f"{t.unit}.service" if "." not in t.unit else t.unit,
            "max_lines": t.max_lines, "port": t.port, "user": t.user,
            "cache_dirs": list(t.cache_dirs()), "cursor": cursor, "api_key": t.api_key}


@dataclass
class Poller:
    """The two round trips of a watch, over one transport."""

    transport: Transport
    target: ProbeTarget
    privileged: Callable[[str], str] = lambda c: c
    settings: Settings = field(default_factory=Settings)
    probe_s: list[float] = field(default_factory=list)  # wall time per probe round trip

    def probe(self, cursor: str | None) -> Snapshot:
        """The agent's `probe` verb, on the service's python (NVML importable there)."""
        t0 = time.monotonic()
        try:
            data = call_with(self.transport, self.privileged, "probe",
                             probe_request(self.target, cursor),
                             timeout=self.settings.probe_timeout_s, python=self.target.python)
        finally:
            self.probe_s.append(time.monotonic() - t0)
        return Snapshot.from_reply(self.transport.name, data)

    def smoke(self) -> Smoke:
        t = self.target
        timeout = self.settings.smoke_timeout_s
        try:
            data = call_with(self.transport, self.privileged, "smoke",
                             smoke.request(t.model, t.port, t.api_key, timeout=timeout),
                             timeout=timeout + 30)
        except HostError as exc:
            return Smoke(ok=False, error=f"smoke did not finish: {exc.message}")
        return smoke.parse(data)

    def streamer(self, note: Callable[[str], None], poll_s: float,
                 sleep: Sleep = time.sleep) -> StreamProbe:
        """A ProbeFn over one held channel; polls (this Poller) every ``poll_s`` when it
        cannot stream."""
        req = probe_request(self.target, None)
        return StreamProbe(self.transport, self.privileged, req, self.target.python,
                           self.probe, poll_s, note=note, sleep=sleep)


def probe_fn(poller: Poller, settings: Settings, poll_s: float, note: Callable[[str], None],
             sleep: Sleep) -> tuple[ProbeFn, float, StreamProbe | None]:
    """The watch's probe and its pause between calls: the stream (no pause: it blocks until
    the host has news) or polling every poll_s."""
    if not settings.stream:
        return poller.probe, poll_s, None
    s = poller.streamer(note, poll_s, sleep)
    return s, 0.0, s


ProbeFn = Callable[[str | None], Snapshot]
SmokeFn = Callable[[], Smoke]
OnPoll = Callable[[reducer.WatchState, Snapshot], None]
OnPredict = Callable[[str, predict.Prediction], None]  # (host, its start predicted)


def _health_ok(state: reducer.WatchState, snap: Snapshot) -> bool:
    return state.health_ok or (snap.http is not None and snap.http.health_status == 200)


def watch(
    probe: ProbeFn,
    run_smoke: SmokeFn,
    budgets: Budgets,
    *,
    poll_s: float,
    first: Snapshot | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    on_poll: OnPoll | None = None,
    trace: IO[str] | None = None,
    max_failures: int = 3,
    host: str = "",
) -> reducer.WatchState:
    """Poll until a terminal verdict. `first` is a snapshot already taken (the shell
    takes one before planning budgets: the cache it shows decides cold or warm)."""
    state = reducer.initial()
    cursor: str | None = None
    failures = 0
    unit_errors = 0  # probes in a row whose `systemctl show` failed
    snap = first
    while True:
        started = clock()
        if snap is None:
            try:
                snap = probe(cursor)
                failures = 0
            except HostError as exc:
                failures += 1
                if failures >= max_failures:
                    raise HostError(host, f"{failures} probes in a row failed: {exc}",
                                    fix="check that the host is reachable and has python3"
                                    ) from None
                sleep(poll_s)
                continue
        # The smoke rides on the snapshot that first showed /health 200 (and every one
        # after until the verdict), so a replayed trace reaches the same verdict.
        if state.verdict not in reducer.TERMINAL and _health_ok(state, snap):
            snap = snap.model_copy(update={"smoke": run_smoke()})
        unit_error = snap.unit.error if snap.unit is not None else None
        unit_errors = unit_errors + 1 if unit_error else 0
        final = systemd.no_systemd(unit_error)
        if unit_errors and (final or unit_errors >= max_failures):
            # nothing else can judge the start: systemd's view of the unit is the proof
            raise HostError(host, f"systemctl cannot answer ({unit_errors} probe(s) in a "
                            f"row): {unit_error}",
                            fix=systemd.FIX if final else "run `systemctl status` on the host")
        state = reducer.step(state, snap, budgets)
        if trace is not None:
            trace.write(snap.to_json() + "\n")
            trace.flush()
        if on_poll is not None:
            on_poll(state, snap)
        if snap.journal.cursor:
            cursor = snap.journal.cursor
        if state.verdict in reducer.TERMINAL:
            return state
        more_waiting = snap.journal.truncated
        snap = None
        if not more_waiting:
            sleep(max(poll_s - (clock() - started), 0.0))


# -- one host, end to end --------------------------------------------------------------


@dataclass
class Outcome:
    host: str
    state: reducer.WatchState | None = None
    plan: BudgetPlan | None = None
    key: BudgetKey | None = None
    trace: str | None = None
    record: HistoryRecord | None = None
    observed_start: bool = False
    error: str | None = None  # the host was lost or the input was bad: no verdict
    exit_code: int = 0
    probe_s: list[float] = field(default_factory=list)
    round_trips: int = 0
    seconds: float = 0.0

    smoke: Smoke | None = None
    streamed: bool = False  # the watch ran on the stream (not polling, not fallen back)
    stream_pids: list[int] = field(default_factory=list)  # the stream's processes on the host
    # hit / miss / partial, from the start's evidence, and for a miss why (vs history)
    compile_cache: compile_cache.CompileCache | None = None
    prediction: predict.Prediction | None = None  # of this start, from history before it

    @property
    def verdict(self) -> reducer.Verdict | None:
        return self.state.verdict if self.state is not None else None


def cache_state(first: Snapshot, cache_dir: str) -> str:
    """Warm when the service's compile cache held files from before this start.

    A file older than the unit's start was there when it began; with no start time any
    file at the first poll counts. This stays right when the watch attaches to a start
    that is already compiling.
    """
    if first.cache is None:
        return "cold"
    d = next((d for d in first.cache.dirs if d.path.rstrip("/") == cache_dir.rstrip("/")), None)
    if d is None or d.files == 0:
        return "cold"
    start = first.unit.exec_main_start_epoch if first.unit is not None else None
    if start is None or d.oldest_mtime is None:
        return "warm"
    return "warm" if d.oldest_mtime < start else "cold"


def with_stall(b: Budgets, stall_s: float | None) -> Budgets:
    if stall_s is None:
        return b
    return replace(b, stall_s={p: stall_s for p in reducer.PHASES},
                   stall_why={p: f"--stall {stall_s:g} (every phase)" for p in reducer.PHASES})


def plan_for(t: Target, key: BudgetKey, past: list[HistoryRecord], settings: Settings,
             gpu_count: int) -> BudgetPlan:
    """A start's budgets from the starts before it of its key (a host's, or a node
    group's head's with the layout in it) over the target's phase defaults, --stall on
    top: one plan for every watch that has history."""
    plan = plan_budgets(past, key, weights_gib_per_gpu=t.profile.weights_gib_per_gpu,
                        gpu_count=max(gpu_count, 1), min_samples=settings.min_samples,
                        defaults=phase_defaults(t.vars.phase_budget_s,
                                                t.vars.stall_window_s))
    return replace(plan, budgets=with_stall(plan.budgets, settings.stall_s))


def stall_note(b: Budgets) -> str | None:
    """The live view's line on stall windows that are not the defaults, and why."""
    moved = [f"{p} {b.stall(p):.0f} s ({why})" for p, why in b.stall_why.items()
             if not why.startswith("default") and p in reducer.PHASES[:-1]]
    if not moved:
        return None
    if len({why for why in b.stall_why.values()}) == 1 and len(moved) > 1:
        return f"stall windows: {next(iter(b.stall_why.values()))}"
    return "stall windows: " + "; ".join(moved)


def trace_path(state_dir: Path, host: str, now: float | None = None) -> Path:
    stamp = datetime.fromtimestamp(now if now is not None else time.time(), UTC)
    return state_dir / "traces" / f"{host}-{stamp.strftime('%Y%m%dT%H%M%SZ')}.jsonl"


OnHostPoll = Callable[[str, reducer.WatchState, Snapshot, Budgets], None]


@dataclass(frozen=True)
class Session:
    """One watched start, built the same way for a deploy's or verify's host and for a
    rollback: the service's probe, its budgets, the pause between polls and the trace it
    writes (a node group builds its probe targets, poll and record the same way). What
    comes before (history in, budgets, the prediction) and after (the record:
    ``record_start``) are stages of their own."""

    name: str
    poller: Poller
    budgets: Budgets
    poll_s: float
    trace: Path
    first: Snapshot | None = None  # a snapshot already taken (it decided cold or warm)


def watch_session(s: Session, out: Outcome, *, note: Callable[[str], None],
                  on_poll: OnHostPoll | None, clock: Clock, sleep: Sleep) -> None:
    """Watch the session's start to a verdict, the trace written as it goes; the verdict,
    smoke, stream and probe times land on ``out``. A lost host raises (HostError)."""
    s.trace.parent.mkdir(parents=True, exist_ok=True)
    out.trace = str(s.trace)
    smokes: list[Smoke] = []

    def smoke_fn() -> Smoke:
        smokes.append(s.poller.smoke())
        return smokes[-1]

    def poll(state: reducer.WatchState, snap: Snapshot) -> None:
        if on_poll is not None:
            on_poll(s.name, state, snap, s.budgets)

    settings = s.poller.settings
    probe, pause, streamer = probe_fn(s.poller, settings, s.poll_s, note, sleep)
    try:
        with open_new(s.trace) as fh:
            out.state = watch(probe, smoke_fn, s.budgets, poll_s=pause, first=s.first,
                              clock=clock, sleep=sleep, on_poll=poll, trace=fh,
                              max_failures=settings.max_probe_failures, host=s.name)
    finally:
        if streamer is not None:
            streamer.close()
            out.stream_pids = list(streamer.pids)
            out.streamed = streamer.fallback is None
    out.smoke = smokes[-1] if smokes else None
    out.exit_code = int(reducer.exit_of(out.state.verdict, ExitCode.FAILED))
    out.probe_s = list(s.poller.probe_s)


def record_start(out: Outcome, transport: Transport, host: HostVars, state_dir: Path) -> None:
    """The stage after the verdict: the start's record (if the watch saw it begin) into
    the host's history and the local mirror. A host that refuses the write is this
    outcome's error, as a lost host is."""
    if out.record is None or out.error is not None:
        return
    try:
        history.record(transport, host, history.Mirror(state_dir / "history.sqlite"),
                       out.record)
    except VigilError as exc:
        out.record = None
        out.error, out.exit_code = str(exc), int(exc.exit_code)


def verify_target(
    t: Target,
    settings: Settings,
    state_dir: Path,
    *,
    transport: Transport | None = None,
    on_poll: OnHostPoll | None = None,
    on_note: Callable[[str, str], None] | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    on_predict: OnPredict | None = None,
) -> Outcome:
    """Watch one deploy target's start: history in, budgets, prediction, the watch (its
    trace), then the record."""
    out = Outcome(t.name)
    t_start = clock()

    def note(message: str) -> None:
        if on_note is not None:
            on_note(t.name, message)

    with ExitStack() as owned:
        if transport is None:
            try:
                transport = owned.enter_context(connect(t.name, t.vars))
            except VigilError as exc:
                out.error, out.exit_code = str(exc), int(exc.exit_code)
                transport = None
        if transport is not None:
            _verify_on(t, transport, settings, state_dir, out, note, on_poll, clock, sleep,
                       on_predict)
            record_start(out, transport, t.vars, state_dir)
            out.round_trips = transport.round_trips
    out.seconds = round(clock() - t_start, 2)
    return out


def _verify_on(t: Target, transport: Transport, settings: Settings, state_dir: Path,
               out: Outcome, note: Callable[[str], None],
               on_poll: OnHostPoll | None, clock: Clock, sleep: Sleep,
               on_predict: OnPredict | None = None) -> None:
    try:
        mirror, cores = history.history_in(transport, t.vars, state_dir, warn=note,
                                           note=note)
        target = ProbeTarget.of(t, settings.max_lines)
        poller = Poller(transport, target, lambda c: privileged(c, t.vars, transport), settings)
        first = poller.probe(None)
        unit = first.unit
        if unit is not None and unit.error is not None:
            raise HostError(t.name, f"systemctl cannot answer for {t.vars.service}: "
                            f"{unit.error}", fix=systemd.FIX if systemd.no_systemd(
                                unit.error) else "run `systemctl status` on the host")
        if unit is not None and unit.error is None and unit.active_state == "inactive" \
                and not unit.main_pid:
            raise HostError(t.name, f"{unit.name} is not running (inactive); nothing to verify",
                            fix=f"start it: invoke deploy --hosts {t.name} --restart")
        out.observed_start = not (first.http is not None and first.http.health_status == 200)
        cold_warm = cache_state(first, target.cache_dir)
        key = history.budget_key(t.vars, t.profile, t.stack, t.rendered,
                                 "warm" if cold_warm == "warm" else "cold", cores)
        gpu_count = t.vars.gpu.count if t.vars.gpu is not None else 1
        past = mirror.records()
        plan = plan_for(t, key, past, settings, gpu_count)
        budgets = plan.budgets
        out.plan, out.key = plan, key
        for line in mirror.warnings:  # rows an older vigil merged, each ignored
            note(line)
        note(f"budgets: {plan.level} ({plan.n_samples} past starts), {key.cache} cache")
        stalls = stall_note(budgets)
        if stalls:
            note(stalls)
        out.prediction = _prediction(t, key, first, past)
        note(f"prediction: {out.prediction.line()}: {out.prediction.cache_why}")
        if on_predict is not None:
            on_predict(t.name, out.prediction)
        session = Session(t.name, poller, budgets, settings.poll_for(t.vars.poll_s),
                          trace_path(state_dir, t.name), first=first)
        watch_session(session, out, note=note, on_poll=on_poll, clock=clock, sleep=sleep)
        state = out.state
        assert state is not None
        out.compile_cache = _compile_cache(t, key, first, state, past)
        if out.observed_start:
            out.record = history.start_record(
                key, state, host=t.name, verdict=state.verdict or "unknown",
                cause=state.cause, profile=t.profile, gpu_count=gpu_count,
                cache=out.compile_cache)
        if out.record is None:
            note("the service was already serving when the watch began: checked, not "
                 "recorded as a start")
    except VigilError as exc:
        out.error = str(exc)
        out.exit_code = int(exc.exit_code)


def _prediction(t: Target, key: BudgetKey, first: Snapshot,
                past: list[HistoryRecord]) -> predict.Prediction:
    """This start predicted from the starts before it: the cache state from what the
    directory held at the first poll and the factors against the host's last cache."""
    gpus = first.gpus
    names = [g.name for g in gpus.devices] if gpus is not None and gpus.error is None else []
    return predict.for_target(past, t, hardware=key.hardware, directory=key.cache,
                              gpus=names)


def _compile_cache(t: Target, key: BudgetKey, first: Snapshot, state: reducer.WatchState,
                   past: list[HistoryRecord]) -> compile_cache.CompileCache:
    """The start's compile cache: its own evidence, the factors of its key (the rendered
    flags and variables, the stack, the GPUs), compared with the last start of this host
    and model that left a cache."""
    gpus = first.gpus
    names = [g.name for g in gpus.devices] if gpus is not None and gpus.error is None else []
    factors = compile_cache.factors_of(
        argv=t.rendered.argv, env=t.rendered.env, secret_names=t.rendered.secret_names,
        stack=key.stack, hardware=key.hardware, gpus=names,
        version=state.compile_cache.version)
    previous = compile_cache.reference(past, host=t.name, model=key.model,
                                       hardware=key.hardware, before=state.started_at)
    return compile_cache.judge(state.compile_cache,
                               reducer.phase_durations(state).get("compiling"),
                               factors=factors, previous=previous)


def verify_all(
    targets: list[Target],
    settings: Settings,
    state_dir: Path,
    *,
    on_poll: Callable[[str, reducer.WatchState, Snapshot, Budgets], None] | None = None,
    on_note: Callable[[str, str], None] | None = None,
    on_predict: OnPredict | None = None,
) -> list[Outcome]:
    """Watch every target's start in parallel, each over its own connection. Whatever
    goes wrong on one host is that host's outcome (a bug in vigil too: InternalError), so
    the others get their verdicts and the reports are written."""

    def one(t: Target) -> Outcome:
        try:
            return verify_target(t, settings, state_dir, on_poll=on_poll, on_note=on_note,
                                 on_predict=on_predict)
        except Exception as exc:  # a bug fails this host, not the whole run
            error = InternalError.of(t.name, exc)
            return Outcome(t.name, error=str(error), exit_code=int(error.exit_code))

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
        return list(pool.map(one, targets))


def worst_exit(outcomes: list[Outcome]) -> int:
    """The run's exit code: the worst of its hosts' (exitcodes.SEVERITY)."""
    return worst(o.exit_code for o in outcomes)


def watch_service(
    name: str,
    transport: Transport,
    target: ProbeTarget,
    settings: Settings,
    state_dir: Path,
    *,
    poll_s: float,
    privileged_fn: Callable[[str], str] = lambda c: c,
    on_poll: OnHostPoll | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Outcome:
    """Watch a start without a deploy target (rollback: the unit on the host is the
    previous release, not what the inventory renders): default budgets, a trace, no
    history record (its key would be the inventory's, not the restored release's)."""
    out = Outcome(name)
    t_start = clock()
    poller = Poller(transport, target, privileged_fn, settings)
    session = Session(name, poller, with_stall(Budgets(), settings.stall_s),
                      settings.poll_for(poll_s), trace_path(state_dir, name))
    try:
        watch_session(session, out, note=lambda _m: None, on_poll=on_poll, clock=clock,
                      sleep=sleep)
    except VigilError as exc:
        out.error, out.exit_code = str(exc), int(exc.exit_code)
    except OSError as exc:
        out.error, out.exit_code = f"{name}: {exc}", int(ExitCode.FAILED)
    out.probe_s = list(poller.probe_s)
    out.seconds = round(clock() - t_start, 2)
    return out
