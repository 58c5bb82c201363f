"""Deploy a node group as one service: order, restart-together and rollback (pure plan,
driven by the per-host deploy).

The plan is a pure function of the group and what each node's own plan would change:

- a change on any node restarts every node (vLLM's ranks start and die together);
- native: the head first, then the workers join it in rank order; ray: the Ray head's unit,
  the Ray workers' units, then vLLM on the head (each Ray unit is a release of its own:
  its unit and env file, backup and lock, on the group's environment);
- before a restart, every worker must reach the head's rendezvous port (vigil.deploy.reach);
- a failure on any node fails the group and stops the rollout there; rollback puts every
  node this deploy replaced back, in the start order (the head first: a worker restored
  before it joined the old head during its stop, seen live).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from vigil.deploy.apply import Options, deploy_host
from vigil.deploy.reach import check as check_reach
from vigil.desired.groups import NodeGroup
from vigil.desired.targets import Target
from vigil.errors import VigilError
from vigil.report import HostResult, HostStatus, Log


@dataclass(frozen=True)
class Step:
    node: str
    what: str  # apply | rollback
    restart: bool
    reason: str
    unit: str = "vllm"  # vllm | ray (the node's Ray unit)

    @property
    def key(self) -> str:
        return unit_key(self.node, self.unit)


def unit_key(node: str, unit: str) -> str:
    """A release of the group: a node's vLLM unit (its name), or its Ray unit."""
    return node if unit == "vllm" else f"{node}/{unit}"


@dataclass(frozen=True)
class GroupPlan:
    group: str
    steps: tuple[Step, ...]
    restart: bool

    def describe(self) -> list[str]:
        return [f"{s.what} {s.key}{' (restart)' if s.restart else ''}: {s.reason}"
                for s in self.steps]


def order(group: NodeGroup) -> tuple[str, ...]:
    """Start order: the head first (the master / the Ray head), workers by rank."""
    return tuple(n.name for n in sorted(group.nodes, key=lambda n: n.rank))


def releases(group: NodeGroup) -> tuple[tuple[str, str, Target], ...]:
    """(node, unit, target) of every release in start order: the engine's own units by
    rank (ray: the Ray head, then its workers: the cluster comes up first), then vLLM on
    every node that serves, by rank (native: the head first, its master waits for the
    workers' ranks; ray: the head only, its executor places the workers on the cluster)."""
    nodes = sorted(group.nodes, key=lambda n: n.rank)
    sides = tuple((n.name, n.side.label, n.side.target) for n in nodes if n.side is not None)
    return (*sides, *((n.name, "vllm", n.target) for n in nodes if n.serves))


def plan_group(group: NodeGroup, changes: Mapping[str, bool], *,
               force_restart: bool = False) -> GroupPlan:
    """What the group's deploy does, in order. ``changes``: release (``unit_key``) -> its
    own plan changes something. Every release is applied (a no-op where nothing differs);
    all restart when any changed."""
    keys = release_keys(group)
    missing = [k for k in keys if k not in changes]
    if missing:
        raise ValueError(f"no plan for {missing[0]}")
    changed = [k for k in keys if changes[k]]
    restart = force_restart or bool(changed)
    steps = []
    for node, unit, _ in releases(group):
        key = unit_key(node, unit)
        if not restart:
            reason = "nothing to do"
        elif changes[key]:
            reason = "changed"
        elif force_restart:
            reason = "--restart"
        else:
            reason = f"the group restarts together ({', '.join(changed)} changed)"
        steps.append(Step(node, "apply", restart, reason, unit))
    return GroupPlan(group.spec.name, tuple(steps), restart)


def rollback_steps(group: NodeGroup, replaced: Mapping[str, bool]) -> tuple[Step, ...]:
    """After a failure: every release this deploy replaced (``replaced``: release -> its
    deploy kept the running release first, ``HostResult.replaced``) goes back; one only
    restarted with the group keeps its files, since a swap there would bring back an older
    release than the one that ran. In the start order, as deploy: native, the head first
    (its restart returns once the old head is gone; a worker restored before it joined
    the old head during that stop, live on the lab, and hung while the restored head
    waited for it in distributed_init); ray, the Ray head, the Ray workers, then vLLM,
    which places its workers on the restored cluster."""
    back = [(node, unit) for node, unit, _ in releases(group)
            if replaced.get(unit_key(node, unit))]
    return tuple(Step(n, "rollback", True, "the group failed: previous release back", u)
                 for n, u in back)


@dataclass
class GroupResult:
    group: str
    status: HostStatus  # OK, CHANGED or FAILED
    nodes: list[HostResult]
    plan: GroupPlan | None = None
    failed_node: str | None = None
    error: str | None = None
    rolled_back: tuple[str, ...] = ()
    replaced: dict[str, bool] = field(default_factory=dict)  # release -> HostResult.replaced
    seconds: float = 0.0


Rollback = Callable[[Step], None]


def deploy_group(group: NodeGroup, opts: Options, log: Log,
                 rollback: Rollback | None = None) -> GroupResult:
    """Check every release, plan the group, apply release by release in order, each
    without its own wait (the group is verified as one: vigil.verify.group).
    ``rollback(step)`` puts a release back; with it a failure rolls every changed one
    back."""
    started = time.monotonic()
    targets = release_targets(group)
    checks = {key: deploy_host(t, replace(opts, check=True, wait=False), log)
              for key, t in targets.items()}
    failed = [r for r in checks.values() if r.status == HostStatus.FAILED]
    if failed:
        return GroupResult(group.spec.name, HostStatus.FAILED, list(checks.values()),
                           failed_node=failed[0].host, error=failed[0].error,
                           seconds=round(time.monotonic() - started, 2))
    plan = plan_group(group, {k: r.status == HostStatus.CHANGED for k, r in checks.items()},
                      force_restart=opts.restart)
    for line in plan.describe():
        log(group.spec.name, ("would " if opts.check else "") + line)
    if plan.restart:  # before any node is touched: a worker cut off from the head would
        check_reach(group)  # wait in distributed_init until a timeout, minutes later
        log(group.spec.name, "rendezvous: every worker reached the head")
    if opts.check:
        return GroupResult(group.spec.name, HostStatus.CHANGED if plan.restart else HostStatus.OK,
                           list(checks.values()), plan,
                           seconds=round(time.monotonic() - started, 2))
    results: list[HostResult] = []
    out = GroupResult(group.spec.name, HostStatus.OK, results, plan)
    for step in plan.steps:
        res = deploy_host(targets[step.key], replace(opts, restart=step.restart, wait=False),
                          log)
        results.append(res)
        # only a release this deploy replaced has one to go back to (a release restarted
        # with the group, or one that failed before its backup, has not)
        out.replaced[step.key] = res.replaced
        if res.status == HostStatus.FAILED:
            out.status, out.failed_node, out.error = HostStatus.FAILED, step.node, res.error
            break
        if res.status == HostStatus.CHANGED:
            out.status = HostStatus.CHANGED
    if out.status == HostStatus.FAILED and rollback is not None:
        done = []
        for back in rollback_steps(group, out.replaced):
            log(group.spec.name, f"rollback {back.key}: {back.reason}")
            try:
                rollback(back)
                done.append(back.key)
            except VigilError as exc:
                log(group.spec.name, f"rollback of {back.key} FAILED: {exc}")
        out.rolled_back = tuple(done)
    out.seconds = round(time.monotonic() - started, 2)
    return out


def release_targets(group: NodeGroup) -> dict[str, Target]:
    """Each release's target by ``unit_key``, in start order."""
    return {unit_key(n, u): t for n, u, t in releases(group)}


def release_keys(group: NodeGroup) -> tuple[str, ...]:
    return tuple(release_targets(group))


def target_of(group: NodeGroup, step: Step) -> Target:
    """The release a step acts on (its vLLM or Ray unit's target)."""
    return release_targets(group)[step.key]
