"""Rolling deploys: hosts in batches behind the verify gate, a failure budget, drain hooks.

The planner is pure (``parse_serial``, ``plan_batches``, ``allowed_failures``); the driver
(``roll``) runs ``deploy_host`` on every host of a batch in parallel and starts the next
batch only when each host of this one is proven ready (``deploy_host`` waits for verify's
real completion) or has failed. Past the failure budget it stops: hosts not reached are
not touched, and ``--rollback-failed`` puts the stopping batch's failed hosts back on
their previous release and verifies them.

``serial`` follows Ansible: a count, a percentage of all hosts, or a list of them; the
last item repeats until every host is in a batch (``1,25%`` = a canary, then quarters).
"""

from __future__ import annotations

import math
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from vigil.deploy import service
from vigil.deploy.apply import FORKS, Options, deploy_host
from vigil.deploy.hooks import Hooks
from vigil.desired.render import API_KEY
from vigil.desired.targets import Target
from vigil.errors import ConfigError, InternalError, VigilError
from vigil.exitcodes import ExitCode, worst
from vigil.report import (
    HostResult,
    HostStatus,
    Log,
    recap,
    recap_line,
    summary_header,
    summary_row,
    summary_table,
    write_text,
    xml_document,
)
from vigil.transport.ssh import connect
from vigil.verify.budgets import phase_defaults
from vigil.verify.report import outcome_json
from vigil.verify.watch import Settings as WatchSettings

# -- the plan (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One item of ``serial``: a host count, or a percentage of all hosts."""

    count: int | None = None
    percent: float | None = None

    def size(self, total: int) -> int:
        if self.count is not None:
            return self.count
        assert self.percent is not None
        # Ansible: a percentage of the play's hosts, rounded down, at least one host
        return max(1, int(total * self.percent / 100))

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{self.percent:g}%"


def _bad(value: str, why: str, flag: str) -> ConfigError:
    return ConfigError(f"{value!r}: {why}", key=flag,
                       fix="a count (2), a percentage (25%) or a list (1,25%,100%)")


def _step(item: str, flag: str) -> Step:
    text = item.strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not (0 < pct <= 100) or math.isnan(pct):
                raise _bad(item, "a percentage must be above 0 and at most 100", flag)
            return Step(percent=pct)
        count = int(text)
    except ValueError:
        raise _bad(item, "not a count or a percentage", flag) from None
    if count < 1:
        raise _bad(item, "a batch needs at least one host", flag)
    return Step(count=count)


def parse_serial(text: str | None) -> tuple[Step, ...]:
    """``None`` (no flag): one batch of every host; else a comma-separated list of steps.
    An empty value is refused: it is what ``--serial "$SERIAL"`` passes when the CI
    variable is unset, and read as "no flag" it would deploy every host at once, with no
    canary."""
    if text is None:
        return ()
    if not text.strip():
        raise ConfigError(f"{text!r} is empty (an unset CI variable?): read as no flag it "
                          "would deploy every host at once, with no canary", key="--serial",
                          fix="give the batches, e.g. --serial 1 or --serial 1,25%,100%, or "
                          "leave the flag out for one batch of every host")
    return tuple(_step(item, "--serial") for item in text.split(","))


def plan_batches(hosts: Sequence[str], serial: str | None) -> list[list[str]]:
    """The hosts in batches, in inventory order. Every host is in exactly one batch."""
    if len(set(hosts)) != len(hosts):
        raise ConfigError("a host is selected twice", key="--hosts")
    steps = parse_serial(serial)
    if not steps:
        return [list(hosts)] if hosts else []
    batches: list[list[str]] = []
    left = list(hosts)
    i = 0
    while left:
        size = steps[min(i, len(steps) - 1)].size(len(hosts))
        batches.append(left[:size])
        left = left[size:]
        i += 1
    return batches


@dataclass(frozen=True)
class Budget:
    """``--max-fail``: failed hosts a batch may have before the rollout stops."""

    count: int | None = 0
    percent: float | None = None

    def allowed(self, batch_size: int) -> int:
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return int(batch_size * self.percent / 100)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{self.percent:g}%"


def parse_budget(text: str | None) -> Budget:
    if text is None or not str(text).strip():
        return Budget()
    item = str(text).strip()
    bad = ConfigError(f"{item!r}: not a count (0, 1, ...) or a percentage (0%..100%)",
                      key="--max-fail", fix="e.g. --max-fail 1 or --max-fail 10%")
    percent = item.endswith("%")
    try:  # int() and float() say ValueError; the user hears the ConfigError
        value = float(item[:-1]) if percent else int(item)
    except ValueError:
        raise bad from None
    if percent and 0 <= value <= 100:  # NaN compares false: refused
        return Budget(count=None, percent=value)
    if not percent and value >= 0:
        return Budget(count=int(value))
    raise bad


def over_budget(failed: int, batch_size: int, budget: Budget) -> bool:
    """Past the budget: more failures than it allows (0 allowed: any failure stops)."""
    return failed > budget.allowed(batch_size)


# -- results ---------------------------------------------------------------------------


@dataclass
class BatchResult:
    index: int
    hosts: list[str]
    results: list[HostResult] = field(default_factory=list)
    allowed_failures: int = 0
    seconds: float = 0.0
    stopped: bool = False  # past the budget: the rollout ends here
    offset_s: float = 0.0  # when it started, from the rollout's start

    @property
    def failed(self) -> list[str]:
        return [r.host for r in self.results if r.status == HostStatus.FAILED]


@dataclass
class Rollout:
    serial: str
    budget: str
    batches: list[BatchResult] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)
    rolled_back: list[HostResult] = field(default_factory=list)
    seconds: float = 0.0
    started_at: float = field(default_factory=time.time)  # epoch, for the picture
    rollback_offset_s: float = 0.0
    # asked for batches (--serial, --max-fail, --rollback-failed) or has several: a plain
    # deploy is a rollout of one batch that says nothing of batches or budgets
    batched: bool = False

    @property
    def results(self) -> list[HostResult]:
        return [r for b in self.batches for r in b.results]

    @property
    def done(self) -> list[str]:
        return [r.host for r in self.results if r.status != HostStatus.FAILED]

    @property
    def failed(self) -> list[str]:
        return [r.host for r in self.results if r.status == HostStatus.FAILED]

    @property
    def stopped(self) -> bool:
        return any(b.stopped for b in self.batches)

    @property
    def exit_code(self) -> int:
        if self.untouched:
            return int(ExitCode.ROLLOUT_STOPPED)
        return worst(r.code for r in self.results)


# -- the driver ------------------------------------------------------------------------


def run(targets: Sequence[Target], opts: Options, log: Log, *, serial: str | None = None,
        max_fail: str | None = None, rollback_failed: bool = False) -> Rollout:
    """``invoke deploy``, every form of it: plan the batches (one without --serial; bad
    flags and phase names are refused before any host is touched), then roll."""
    batches = plan_batches([t.name for t in targets], serial)
    budget = parse_budget(max_fail)
    for t in targets:  # a phase name the catalog does not know fails before any host
        phase_defaults(t.vars.phase_budget_s, t.vars.stall_window_s)
    batched = serial is not None or bool(max_fail) or rollback_failed
    if batched and not opts.wait and not opts.check:
        raise ConfigError("a rolling deploy gates each batch on verify; it cannot skip the "
                          "wait", key="--no-wait", fix="drop --no-wait")
    rollback_one = None
    if rollback_failed and not opts.check:
        def rollback_one(t: Target) -> HostResult:
            return rollback_host(t, opts.watch, opts.state_dir, log, opts.hooks)
    # the canary (the first host of the first batch) is who may seed others by default
    opts = replace(opts, trust=replace(opts.trust, canary=batches[0][0] if batches else None))
    return roll(targets, batches, budget, lambda t: deploy_host(t, opts, log), log,
                rollback_one=rollback_one, serial=serial or "", forks=opts.forks,
                batched=batched, check=opts.check)


DeployOne = Callable[[Target], HostResult]


def roll(targets: Sequence[Target], batches: list[list[str]], budget: Budget,
         deploy_one: DeployOne, log: Log, *,
         rollback_one: DeployOne | None = None, serial: str = "",
         forks: int = FORKS, batched: bool | None = None, check: bool = False) -> Rollout:
    """Deploy batch after batch; stop past the budget. ``deploy_one`` must return only once
    its host is proven ready or has failed (``deploy_host`` with wait does). A check
    changes nothing, so no budget protects a later batch: it plans every one and says
    where a real run would stop."""
    by_name = {t.name: t for t in targets}
    if batched is None:
        batched = len(batches) > 1 or bool(serial) or rollback_one is not None
    out = Rollout(serial=serial or "all", budget=str(budget), batched=batched)
    started = time.monotonic()

    def say(message: str) -> None:
        if batched:  # a plain deploy's one batch goes unannounced
            log("rollout", message)

    for i, names in enumerate(batches, 1):
        batch = BatchResult(i, list(names), allowed_failures=budget.allowed(len(names)))
        out.batches.append(batch)
        say(f"batch {i}/{len(batches)}: {', '.join(names)}")
        t0 = time.monotonic()
        batch.offset_s = round(t0 - started, 2)
        # the whole batch at once, up to --forks
        with ThreadPoolExecutor(max_workers=max(1, min(forks, len(names)))) as pool:
            batch.results = list(pool.map(lambda n: deploy_one(by_name[n]), names))
        batch.seconds = round(time.monotonic() - t0, 2)
        failed = batch.failed
        over = over_budget(len(failed), len(names), budget)
        if over and check:
            say(f"batch {i}: {len(failed)} would fail ({', '.join(failed)}), budget "
                f"{budget} allows {batch.allowed_failures}: a real run would stop here")
        elif over and batched:
            batch.stopped = True
            out.untouched = [n for later in batches[i:] for n in later]
            say(f"batch {i}: {len(failed)} failed ({', '.join(failed)}), "
                f"budget {budget} allows {batch.allowed_failures}: stopping; "
                f"{len(out.untouched)} host(s) untouched")
            out.rollback_offset_s = round(time.monotonic() - started, 2)
            if rollback_one is not None:
                for res in batch.results:
                    if res.status == HostStatus.FAILED:
                        out.rolled_back.append(_rollback_if_changed(by_name[res.host], res,
                                                                    rollback_one, log))
            break
        else:
            say(f"batch {i}: {len(names) - len(failed)} {'planned' if check else 'ready'}, "
                f"{len(failed)} failed (budget {budget} allows {batch.allowed_failures})")
    out.seconds = round(time.monotonic() - started, 2)
    return out


def _rollback_if_changed(t: Target, failed: HostResult, rollback_one: DeployOne,
                         log: Log) -> HostResult:
    # A deploy that failed before its restart changed nothing the service runs, and one
    # without a backup (a plain --restart) has no release of its own to undo: a rollback
    # there would swap in an older release than the one that was running.
    took_backup = any(a.startswith("backup") for a in failed.actions)
    if not (failed.restarted and took_backup):
        log(t.name, "not rolled back: this deploy did not replace the release "
            "(it failed before its restart)")
        return HostResult(t.name, HostStatus.SKIPPED,
                          error="the deploy did not replace the release")
    return rollback_one(t)


def rollback_host(t: Target, settings: WatchSettings, state_dir: Path, log: Log,
                  hooks: Hooks | None = None) -> HostResult:
    """Put the previous release back (unit, env file, environment link), restart and watch
    it until a real completion, as ``invoke rollback`` does."""
    started = time.monotonic()
    result = HostResult(t.name, HostStatus.FAILED, actions=["rollback: previous release"])

    def say(message: str) -> None:
        log(t.name, message)

    try:
        with connect(t.name, t.vars) as transport:
            outcome = service.rollback(transport, t.vars, wait=True, settings=settings,
                                       state_dir=state_dir, log=log,
                                       api_key=t.rendered.env.get(API_KEY))
        assert outcome is not None
        result.restarted = True
        result.verify = outcome_json(outcome)
        result.verdict = outcome.verdict
        result.main_pid = service.ready_pid(t.name, outcome)
        if hooks is not None:
            hooks.run("after_ready", t, say)
        result.status = HostStatus.ROLLED_BACK
        say("previous release serving again")
    except Exception as exc:  # a bug fails this host, not the rollout
        err = exc if isinstance(exc, VigilError) else InternalError.of(t.name, exc)
        result.error = str(err)
        say(f"ROLLBACK FAILED: {err}")
    result.seconds = round(time.monotonic() - started, 2)
    return result


# -- recap for people and pipelines ----------------------------------------------------


def _phases(r: HostResult) -> dict[str, float]:
    phases = (r.verify or {}).get("phases") or []
    return {p["name"]: p["duration_s"] for p in phases if isinstance(p, dict)}


def summary(ro: Rollout) -> str:
    """The deploy's recap: a host per line and Ansible's counts; a batched rollout adds
    each host's batch, the untouched and rolled-back hosts and why it stopped."""
    if not (ro.batched or ro.untouched or ro.rolled_back):
        return summary_table(ro.results)
    width = max([8, *(len(r.host) for r in [*ro.results, *ro.rolled_back]),
                 *(len(h) for h in ro.untouched)])
    lines = [f"{'BATCH':<5} {summary_header(width)}"]
    lines += [f"{b.index:<5} {summary_row(r, width)}" for b in ro.batches for r in b.results]
    lines += [f"{'-':<5} {h:<{width}}  {'untouched':<11} {'-':>8} {'':>8}  rollout stopped"
              for h in ro.untouched]
    lines += [f"{'rb':<5} {summary_row(r, width)}" for r in ro.rolled_back]
    rolled = sum(r.status == HostStatus.ROLLED_BACK for r in ro.rolled_back)
    lines.append(recap_line(ro.results) + f" untouched={len(ro.untouched)}"
                 + (f" rolled_back={rolled}" if ro.rolled_back else "")
                 + (" — stopped: failure budget exceeded" if ro.stopped else ""))
    return "\n".join(lines)


def rollout_json(ro: Rollout) -> dict[str, Any]:
    return {
        "ok": ro.exit_code == 0,
        "exit_code": ro.exit_code,
        "recap": recap(ro.results),
        "serial": ro.serial,
        "max_fail": ro.budget,
        "stopped": ro.stopped,
        "seconds": ro.seconds,
        "done": ro.done,
        "failed": ro.failed,
        "untouched": ro.untouched,
        "batches": [{
            "index": b.index, "hosts": b.hosts, "offset_s": b.offset_s, "seconds": b.seconds,
            "failed": b.failed, "allowed_failures": b.allowed_failures, "stopped": b.stopped,
        } for b in ro.batches],
        "hosts": {r.host: {**asdict(r), "unreachable": r.unreachable, "batch": b.index,
                           "phases": _phases(r)}
                  for b in ro.batches for r in b.results},
        "rolled_back": {r.host: asdict(r) for r in ro.rolled_back},
    }


def junit_xml(ro: Rollout) -> str:
    """One test case per host (suite per batch); failed is a failure, untouched skipped."""
    suites = ET.Element("testsuites", name="vigil.deploy", time=f"{ro.seconds:.2f}")

    def suite(name: str, tests: int, failures: int, skipped: int, secs: float) -> ET.Element:
        return ET.SubElement(suites, "testsuite", name=name, tests=str(tests),
                             failures=str(failures), errors="0", skipped=str(skipped),
                             time=f"{secs:.2f}")

    rolled = {r.host: r for r in ro.rolled_back}
    for b in ro.batches:
        s = suite(f"batch {b.index}", len(b.results), len(b.failed), 0, b.seconds)
        for r in b.results:
            case = ET.SubElement(s, "testcase", classname=f"vigil.deploy.batch{b.index}",
                                 name=r.host, time=f"{r.seconds:.2f}")
            if r.status == HostStatus.FAILED:
                first = (r.error or "failed").splitlines()[0]
                el = ET.SubElement(case, "failure", message=first, type=r.verdict or "failed")
                el.text = r.error
            out = [f"{r.status}; " + ", ".join(f"{k} {v:.1f}s" for k, v in _phases(r).items())]
            if r.host in rolled:
                rb = rolled[r.host]
                out.append(f"rollback: {rb.status}" + (f" ({rb.error})" if rb.error else ""))
            ET.SubElement(case, "system-out").text = "\n".join(out)
    if ro.untouched:
        s = suite("untouched", len(ro.untouched), 0, len(ro.untouched), 0.0)
        for h in ro.untouched:
            case = ET.SubElement(s, "testcase", classname="vigil.deploy.untouched", name=h,
                                 time="0.00")
            ET.SubElement(case, "skipped", message="rollout stopped by the failure budget")
    return xml_document(suites)


def write_junit(path: str, ro: Rollout) -> None:
    write_text(path, junit_xml(ro))
