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

from vigil.errors import HostError, VigilError
from vigil.exitcodes import SEVERITY, VERDICT_EXIT, ExitCode
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
    from vigil.desired.targets import Target

Clock = Callable[[], float]
Sleep = Callable[[float], None]

# VERDICT_EXIT (vigil/exitcodes.py): the documented exit code of each terminal verdict.

POLL_S = 5.0  # a start watched without inventory variables (rollback): poll_s's default


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
        return Snapshot.from_dict(data)

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

    def streamer(self, note: Callable[[str], None], sleep: Sleep = time.sleep) -> StreamProbe:
        """A ProbeFn over one held channel; polls (this Poller) when it cannot stream."""
        req = probe_request(self.target, None)
        return StreamProbe(self.transport, self.privileged, req, self.target.python,
                           self.probe, self.settings.poll_s or POLL_S, note=note, sleep=sleep)


def probe_fn(poller: Poller, settings: Settings, poll_s: float, note: Callable[[str], None],
             sleep: Sleep) -> tuple[ProbeFn, float, StreamProbe | None]:
    """The watch's probe and its pause between calls: the stream (no pause: it blocks until
    the host has news) or polling every poll_s."""
    if not settings.stream:
        return poller.probe, poll_s, None
    s = replace(poller.streamer(note, sleep), poll_s=poll_s)
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
    poll_s: float = 5.0,
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
            except (ValueError, HostError) as exc:
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
    def verdict(self) -> str | None:
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


def verify_target(
    t: Target,
    settings: Settings,
    state_dir: Path,
    *,
    transport: Transport | None = None,
    on_poll: Callable[[str, reducer.WatchState, Snapshot, Budgets], None] | None = None,
    on_note: Callable[[str, str], None] | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    on_predict: OnPredict | None = None,
) -> Outcome:
    """Watch one deploy target's start: history in, budgets, prediction, watch, record,
    trace."""
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
            out.round_trips = transport.round_trips
    out.seconds = round(clock() - t_start, 2)
    return out


def _verify_on(t: Target, transport: Transport, settings: Settings, state_dir: Path,
               out: Outcome, note: Callable[[str], None],
               on_poll: Callable[[str, reducer.WatchState, Snapshot, Budgets], None] | None,
               clock: Clock, sleep: Sleep, on_predict: OnPredict | None = None) -> None:
    try:
        mirror = history.Mirror(state_dir / "history.sqlite")
        cores, host_records = history.read_host(transport, t.vars, warn=note)
        added = mirror.add(host_records)
        if added:
            note(f"history: {added} record(s) from the host merged into the local mirror")
        target = ProbeTarget(
            unit=t.vars.service, port=t.vars.port, user=t.vars.service_user,
            cache_dir=t.rendered.paths.cache, python=t.rendered.paths.python,
            model=smoke.served_name(t.profile), api_key=t.rendered.env.get("VLLM_API_KEY"),
            max_lines=settings.max_lines,
        )
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
        plan = plan_budgets(past, key,
                            weights_gib_per_gpu=t.profile.weights_gib_per_gpu,
                            gpu_count=max(gpu_count, 1), min_samples=settings.min_samples,
                            defaults=phase_defaults(t.vars.phase_budget_s,
                                                    t.vars.stall_window_s))
        budgets = with_stall(plan.budgets, settings.stall_s)
        plan = replace(plan, budgets=budgets)
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
        path = trace_path(state_dir, t.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        out.trace = str(path)
        smokes: list[Smoke] = []

        def smoke_fn() -> Smoke:
            s = poller.smoke()
            smokes.append(s)
            return s

        def poll(state: reducer.WatchState, snap: Snapshot) -> None:
            if on_poll is not None:
                on_poll(t.name, state, snap, budgets)

        probe, pause, streamer = probe_fn(poller, settings, settings.poll_s or t.vars.poll_s,
                                          note, sleep)
        try:
            with path.open("w", encoding="utf-8") as fh:
                state = watch(probe, smoke_fn, budgets, poll_s=pause, first=first,
                              clock=clock, sleep=sleep, on_poll=poll, trace=fh,
                              max_failures=settings.max_probe_failures, host=t.name)
        finally:
            if streamer is not None:
                streamer.close()
                out.stream_pids = list(streamer.pids)
                out.streamed = streamer.fallback is None
        out.state = state
        out.smoke = smokes[-1] if smokes else None
        out.compile_cache = _compile_cache(t, key, first, state, past)
        out.exit_code = int(VERDICT_EXIT.get(state.verdict or "", ExitCode.FAILED))
        if out.observed_start and state.started_at is not None:
            rec = HistoryRecord(
                key=key, started_at=state.started_at, verdict=state.verdict or "unknown",
                phases_s={k: round(v, 3) for k, v in reducer.phase_durations(state).items()},
                total_s=round((state.now or state.started_at) - state.started_at, 3),
                cause=state.cause, host=t.name,
                quiet_s={k: round(v, 3) for k, v in state.quiet_s.items()},
                weights_gib_per_gpu=t.profile.weights_gib_per_gpu, gpu_count=gpu_count,
                compile_cache=out.compile_cache.to_record(),
            )
            history.append_host(transport, t.vars, rec)
            mirror.add([rec])
            out.record = rec
        else:
            note("the service was already serving when the watch began: checked, not "
                 "recorded as a start")
        out.probe_s = list(poller.probe_s)
    except VigilError as exc:
        out.error = str(exc)
        out.exit_code = int(exc.exit_code)
    except ValueError as exc:  # the probe's output was not a snapshot
        out.error = f"{t.name}: {exc}"
        out.exit_code = int(ExitCode.FAILED)


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
    """Watch every target's start in parallel, each over its own connection."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
        return list(pool.map(lambda t: verify_target(t, settings, state_dir, on_poll=on_poll,
                                                     on_note=on_note, on_predict=on_predict),
                             targets))


def worst_exit(outcomes: list[Outcome]) -> int:
    """The run's exit code: bad input first, then the worst verdict (timed out > stalled >
    crashed > stopped), then a lost host (unreachable before any other failure)."""
    codes = {o.exit_code for o in outcomes}
    return next((int(code) for code in SEVERITY if code in codes), 0)


def watch_service(
    name: str,
    transport: Transport,
    target: ProbeTarget,
    settings: Settings,
    state_dir: Path,
    *,
    privileged_fn: Callable[[str], str] = lambda c: c,
    on_poll: Callable[[str, reducer.WatchState, Snapshot, Budgets], None] | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Outcome:
    """Watch a start without a deploy target (rollback: the unit on the host is the
    previous release, not what the inventory renders): default budgets, a trace, no
    history record (its key would be the inventory's, not the restored release's)."""
    out = Outcome(name)
    t_start = clock()
    budgets = with_stall(Budgets(), settings.stall_s)
    poller = Poller(transport, target, privileged_fn, settings)
    path = trace_path(state_dir, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out.trace = str(path)
        smokes: list[Smoke] = []

        def smoke_fn() -> Smoke:
            smokes.append(poller.smoke())
            return smokes[-1]

        def poll(state: reducer.WatchState, snap: Snapshot) -> None:
            if on_poll is not None:
                on_poll(name, state, snap, budgets)

        probe, pause, streamer = probe_fn(poller, settings, settings.poll_s or POLL_S,
                                          lambda _m: None, sleep)
        try:
            with path.open("w", encoding="utf-8") as fh:
                out.state = watch(probe, smoke_fn, budgets, poll_s=pause, clock=clock,
                                  sleep=sleep, on_poll=poll, trace=fh,
                                  max_failures=settings.max_probe_failures, host=name)
        finally:
            if streamer is not None:
                streamer.close()
        out.smoke = smokes[-1] if smokes else None
        out.exit_code = int(VERDICT_EXIT.get(out.state.verdict or "", ExitCode.FAILED))
    except VigilError as exc:
        out.error, out.exit_code = str(exc), int(exc.exit_code)
    except (OSError, ValueError) as exc:
        out.error, out.exit_code = f"{name}: {exc}", int(ExitCode.FAILED)
    out.probe_s = list(poller.probe_s)
    out.seconds = round(clock() - t_start, 2)
    return out
