"""Invoke tasks of node groups (one model across several hosts): ``group.deploy``,
``group.verify``, ``group.render``, ``group.rollback``. Each parses its flags, makes one
library call and reports."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from invoke.collection import Collection
from invoke.context import Context

from vigil.exitcodes import ExitCode
from vigil.report import HostStatus, Log, echo, failed_word
from vigil.tasks.common import (
    SET_HELP,
    exit_with,
    load_inventory,
    out_path,
    setting,
    template_dirs,
    user_errors,
    vigil_task,
    watch_settings,
    worst_code,
)

if TYPE_CHECKING:  # a task's libraries load when it runs, not at `vigil --help`
    from vigil.deploy.group import Step
    from vigil.desired.groups import NodeGroup
    from vigil.desired.render import Secrets
    from vigil.verify.group import GroupState
    from vigil.verify.watch import Settings


NAME_HELP = "node group (inventory/node_groups/NAME.yml)"


def _resolve(c: Context, name: str, sets: list[str] | None, *, secrets: Secrets = True,
             ) -> NodeGroup:
    from vigil.desired.groups import resolve_group

    return resolve_group(load_inventory(c), name, sets=sets or [],
                         template_dir=template_dirs(c), require_secrets=secrets)


def _group_log(g: NodeGroup) -> Log:
    """The group tasks' log, which first says the group's notes."""
    log = Log(width=max(len(n) for n in (*g.names, g.spec.name)))
    for note in g.notes:
        log(g.spec.name, note)
    return log


def _show(log: Log, group: str) -> Callable[[GroupState], None]:

    last: list[str] = []

    def on_poll(gs: GroupState) -> None:
        line = gs.summary + "  [" + ", ".join(f"{n} {p}" for n, p in gs.phases.items()) + "]"
        if not last or last[-1] != line:
            log(group, line)
            last.append(line)
    return on_poll


def _watch(c: Context, g: NodeGroup, log: Log, settings: Settings) -> int:
    from vigil.verify import reducer
    from vigil.verify.group import verify_group

    gs = verify_group(g, settings, state_dir=setting(c, "state_dir"),
                      on_poll=_show(log, g.spec.name),
                      on_note=lambda line: log(g.spec.name, f"warning: {line}")).history[-1]
    if gs.verdict is None:
        log(g.spec.name, "no verdict")
        return int(ExitCode.TIMED_OUT)
    where = f" on {gs.node}" if gs.node else ""
    log(g.spec.name, f"{gs.verdict.upper()}{where}: {gs.summary}")
    if gs.proof:
        log(g.spec.name, f"proof: {gs.proof}")
    if gs.remedy:
        log(g.spec.name, f"remedy: {gs.remedy}")
    return int(reducer.exit_of(gs.verdict, ExitCode.FAILED))


def _rollback(c: Context, g: NodeGroup, log: Log, steps: Sequence[Step]) -> None:
    from vigil.deploy import service
    from vigil.deploy.group import target_of
    from vigil.transport.ssh import connect

    settings, state_dir = watch_settings(c), setting(c, "state_dir")
    for step in steps:
        hv = target_of(g, step).vars  # a Ray unit's vars name its own release
        with connect(step.node, hv) as transport:
            service.rollback(transport, hv, wait=False, settings=settings,
                             state_dir=state_dir, log=log)


@vigil_task(help={"name": NAME_HELP, "check": "show the group's plan and diffs, change nothing",
            "restart": "restart the group even when nothing changed", "set": SET_HELP,
            "no_wait": "do not verify the group's start",
            "stall": "override every phase's stall window, in seconds",
            "rollback_failed": "when a node fails, put every changed node back"},
      iterable=["set_"])
def deploy(c: Context, name: str, check: bool = False, restart: bool = False,
           set_: list[str] | None = None, no_wait: bool = False, stall: float | None = None,
           rollback_failed: bool = False) -> None:
    """Deploy a node group as one service: every node planned, the group restarted
    together in the order its backend needs, then one verdict for the group."""
    from vigil.deploy import apply as deploy_mod
    from vigil.deploy.group import deploy_group, rollback_steps

    with user_errors():
        g = _resolve(c, name, set_)
        log = _group_log(g)
        opts = deploy_mod.Options(check=check, restart=restart, wait=False,
                                  state_dir=setting(c, "state_dir"))
        result = deploy_group(g, opts, log, rollback=(
            (lambda step: _rollback(c, g, log, [step])) if rollback_failed else None))
        codes = [r.exit_code for r in result.nodes if r.status == HostStatus.FAILED]
        word = failed_word(worst_code(codes), "failed")  # the node's own word and code
        log(name, f"group {result.status}" + (f" at {result.failed_node} ({word}): "
                                              f"{result.error}" if result.failed_node
                                              else ""))
        if result.status == HostStatus.FAILED:
            exit_with(codes or [ExitCode.FAILED])
            return
        if check or no_wait or (result.plan is not None and not result.plan.restart):
            return
        code = _watch(c, g, log, watch_settings(c, stall=stall))
        if code and rollback_failed:
            back = rollback_steps(g, result.replaced)
            log(name, "the group did not come up: " + (
                "rolling back " + ", ".join(s.key for s in back) if back else
                "nothing to roll back (this deploy replaced no release)"))
            _rollback(c, g, log, back)
    exit_with([code])


@vigil_task(help={"name": NAME_HELP, "set": SET_HELP + " (as deploy)",
            "stall": "override every phase's stall window, in seconds",
            "poll": "seconds between polls"}, iterable=["set_"])
def verify(c: Context, name: str, set_: list[str] | None = None, stall: float | None = None,
           poll: float | None = None) -> None:
    """Watch every node's start: the group's phase, who joined, one verdict."""
    from vigil.desired.render import SMOKE_SECRETS

    with user_errors():
        g = _resolve(c, name, set_, secrets=SMOKE_SECRETS)  # it writes nothing
        code = _watch(c, g, _group_log(g), watch_settings(c, poll, stall))
    exit_with([code])


@vigil_task(help={"name": NAME_HELP, "out": "directory: OUT/GROUP/HOST/", "set": SET_HELP},
      iterable=["set_"])
def render(c: Context, name: str, out: str = "rendered", set_: list[str] | None = None,
           ) -> None:
    """Write every node's files (secrets masked) to OUT/GROUP/HOST/."""
    from vigil.desired import review

    with user_errors():
        g = _resolve(c, name, set_, secrets=False)
        echo(f"node group {name}: {g.layout.label}, head {g.head.name}, master "
              f"{g.master_addr}")
        for note in g.notes:
            echo(note)
        for n in g.nodes:
            where = out_path(c, out) / name / n.name
            if n.serves:
                echo("\n".join(review.write_files(n.target, where)))
            if n.side is not None:
                where.mkdir(parents=True, exist_ok=True)
                (where / n.side.name).write_text(n.side.text)
                echo(f"{where / n.side.name}  ({n.side.path} on {n.name})")


@vigil_task(help={"name": NAME_HELP})
def rollback(c: Context, name: str) -> None:
    """Put every release of the group back in the start order (native: the head first,
    then the workers; ray: the Ray head, the Ray workers, then vLLM) and verify it."""
    from vigil.deploy.group import release_keys, rollback_steps

    with user_errors():
        g = _resolve(c, name, None)
        log = _group_log(g)
        _rollback(c, g, log, rollback_steps(g, dict.fromkeys(release_keys(g), True)))
        code = _watch(c, g, log, watch_settings(c))
    exit_with([code])


ns = Collection("group", deploy, verify, render, rollback)
