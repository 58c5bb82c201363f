"""Deploy a node group as one service: order, restart-together and rollback (pure plan,
driven by the per-host deploy).

The plan is a pure function of the group and what each node's own plan would change:

- a change on any node restarts every node (vLLM's ranks start and die together);
- native: the head first, then the workers join it in rank order; ray: the Ray head, the
  Ray workers, then vLLM on the head;
- a failure on any node fails the group and stops the rollout there; rollback puts every
  node this deploy changed back (workers first, the head last, so nothing joins a
  half-restored head).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from vigil.deploy.apply import Options, deploy_host
from vigil.desired.groups import NodeGroup
from vigil.errors import ConfigError, VigilError
from vigil.report import HostResult, Log


@dataclass(frozen=True)
class Step:
    node: str
    what: str  # apply | rollback
    restart: bool
    reason: str


@dataclass(frozen=True)
class GroupPlan:
    group: str
    steps: tuple[Step, ...]
    restart: bool

    def describe(self) -> list[str]:
        return [f"{s.what} {s.node}{' (restart)' if s.restart else ''}: {s.reason}"
                for s in self.steps]


def order(group: NodeGroup) -> tuple[str, ...]:
    """Start order: the head first (the master / the Ray head), workers by rank."""
    return tuple(n.name for n in sorted(group.nodes, key=lambda n: n.rank))


def plan_group(group: NodeGroup, changes: Mapping[str, bool], *,
               force_restart: bool = False) -> GroupPlan:
    """What the group's deploy does, in order. ``changes``: node -> its own plan changes
    something. Every node is applied (a no-op where nothing differs); all restart when
    any changed."""
    missing = [n for n in group.names if n not in changes]
    if missing:
        raise ValueError(f"no plan for node {missing[0]}")
    changed = [n for n in group.names if changes[n]]
    restart = force_restart or bool(changed)
    steps = []
    for name in order(group):
        if not restart:
            reason = "nothing to do"
        elif changes[name]:
            reason = "changed"
        elif force_restart:
            reason = "--restart"
        else:
            reason = f"the group restarts together ({', '.join(changed)} changed)"
        steps.append(Step(name, "apply", restart, reason))
    return GroupPlan(group.spec.name, tuple(steps), restart)


def rollback_steps(group: NodeGroup, applied: Mapping[str, bool]) -> tuple[Step, ...]:
    """After a failure: every node whose release this deploy replaced goes back, workers
    first and the head last."""
    back = [n for n in reversed(order(group)) if applied.get(n)]
    return tuple(Step(n, "rollback", True, "the group failed: previous release back")
                 for n in back)


@dataclass
class GroupResult:
    group: str
    status: str  # ok | changed | failed
    nodes: list[HostResult]
    plan: GroupPlan | None = None
    failed_node: str | None = None
    error: str | None = None
    rolled_back: tuple[str, ...] = ()
    seconds: float = 0.0


Rollback = Callable[[str], None]


def deploy_group(group: NodeGroup, opts: Options, log: Log,
                 rollback: Rollback | None = None) -> GroupResult:
    """Check every node, plan the group, apply node by node in order, each without its
    own wait (the group is verified as one: vigil.verify.group). ``rollback(node)`` puts a
    node's previous release back; with it a failure rolls every changed node back."""
    if group.spec.backend == "ray":
        # its Ray units are rendered and checked, not yet planned into the release
        raise ConfigError(
            f"node group {group.spec.name}: deploying backend ray is not supported yet",
            file=group.file, key="backend",
            fix=f"invoke group.render --name {group.spec.name} shows its units; use "
            "backend: native to deploy")
    started = time.monotonic()
    targets = {n.name: n.target for n in group.nodes}
    checks = {name: deploy_host(t, replace(opts, check=True, wait=False), log)
              for name, t in targets.items()}
    failed = [r for r in checks.values() if r.status == "failed"]
    if failed:
        return GroupResult(group.spec.name, "failed", list(checks.values()),
                           failed_node=failed[0].host, error=failed[0].error,
                           seconds=round(time.monotonic() - started, 2))
    plan = plan_group(group, {n: r.status == "changed" for n, r in checks.items()},
                      force_restart=opts.restart)
    for line in plan.describe():
        log(group.spec.name, ("would " if opts.check else "") + line)
    if opts.check:
        return GroupResult(group.spec.name, "changed" if plan.restart else "ok",
                           list(checks.values()), plan,
                           seconds=round(time.monotonic() - started, 2))
    results: list[HostResult] = []
    applied: dict[str, bool] = {}
    out = GroupResult(group.spec.name, "ok", results, plan)
    for step in plan.steps:
        res = deploy_host(targets[step.node], replace(opts, restart=step.restart, wait=False),
                          log)
        results.append(res)
        # only a node whose files this deploy replaced has a release to go back to
        applied[step.node] = checks[step.node].status == "changed"
        if res.status == "failed":
            out.status, out.failed_node, out.error = "failed", step.node, res.error
            break
        if res.status == "changed":
            out.status = "changed"
    if out.status == "failed" and rollback is not None:
        done = []
        for back in rollback_steps(group, applied):
            log(group.spec.name, f"rollback {back.node}: {back.reason}")
            try:
                rollback(back.node)
                done.append(back.node)
            except VigilError as exc:
                log(group.spec.name, f"rollback of {back.node} FAILED: {exc}")
        out.rolled_back = tuple(done)
    out.seconds = round(time.monotonic() - started, 2)
    return out
