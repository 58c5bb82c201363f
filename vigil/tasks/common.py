"""What every Invoke task shares: project paths from the config, host-selection help,
user errors as one message and an exit code, and running work on hosts in parallel."""

from __future__ import annotations

import functools
import inspect
import json as json_mod
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import Task

from vigil.errors import ConfigError, InternalError, VigilError
from vigil.exitcodes import SEVERITY as SEVERITY  # one exit-code policy for every task
from vigil.exitcodes import worst
from vigil.report import echo, write_json
from vigil.tasks import project

if TYPE_CHECKING:  # a task's libraries load when it runs, not at `vigil --help`
    from vigil.desired import inventory
    from vigil.verify.watch import Settings

HOSTS_HELP = ("hosts, groups or all, comma separated; Ansible's patterns too: g:!h (g "
              "without h), g:&k (in both), h100-*, h100-[01:04], ~regex")
SET_HELP = "KEY=VALUE override of a host variable or profile field (repeatable)"

T = TypeVar("T")
# Tasks that change hosts act on no host by default: `all` is said, never implied.
CHANGING_HOSTS_HELP = HOSTS_HELP + "; required (--hosts all for every host)"


def hosts_given(hosts: str | None, task: str) -> str:
    if hosts is None or not hosts.strip():
        raise ConfigError(f"{task} changes hosts: say which", key="--hosts",
                          fix=f"vigil {task} --hosts NAME (a host, a group, a pattern, or "
                          "all for every host)")
    return hosts
INVENTORY_HELP = ("inventory folder (default: the project's: vigil.yaml's inventory, else "
                  "./inventory); relative to the project root")


# The only short flags, each the same on every task that has the option, and each what
# it means to ansible-playbook (-i inventory, -l limit, -f forks, -C check, -e extra
# vars); no task takes Ansible's others (-u -D -v -K -k -b -c -t -T -M -J), so none means
# something else. Invoke's automatic ones (-f became --after-ready) are not used.
SHORT_FLAGS: dict[str, tuple[str, ...]] = {
    "inventory": ("i",), "hosts": ("l",), "forks": ("f",), "check": ("C",),
    "set": ("e",), "model": ("m",), "stack": ("s",), "json": ("j",), "name": ("n",),
}
# Long aliases: Ansible's --limit is --hosts.
LONG_ALIASES: dict[str, tuple[str, ...]] = {"hosts": ("limit",)}


class VigilTask(Task[Any]):
    """Invoke's task with vigil's flag manners: -h stays --help, and the only short
    flags are SHORT_FLAGS's, the same letter for one option on every task."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, set(taken_names))
        long = opts["names"][0]
        opts["names"] = [long, *LONG_ALIASES.get(long, ()), *SHORT_FLAGS.get(long, ())]
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        # Invoke pops each flag's help as it reads it: a second look (the docs generator
        # after a test, --help after a parse) would find none
        kept = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept


Body = Callable[..., None]


def vigil_task(*, inventory: bool = True, **kwargs: Any) -> Callable[[Body], Task[Any]]:
    """``@task`` for vigil's tasks: adds ``-i/--inventory`` to the task's flags (unless
    ``inventory=False``: a task that reads none); a given inventory replaces the
    configured one for this run. A task's ``--json`` takes an optional value (bare: the
    JSON on stdout; with a value: that file; see ``emit_json``)."""
    def decorate(body: Body) -> Task[Any]:
        if "json" in inspect.signature(body).parameters:
            kwargs["optional"] = [*kwargs.get("optional", ()), "json"]
        if not inventory:
            return VigilTask(body, **kwargs)
        sig = inspect.signature(body)
        param = inspect.Parameter("inventory", inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation="str | None")
        params = list(sig.parameters.values())
        at = next((i for i, p in enumerate(params) if p.kind == p.VAR_KEYWORD), len(params))

        @functools.wraps(body)
        def run(c: Context, *a: Any, inventory: str | None = None, **kw: Any) -> None:
            if inventory is not None:
                c.config.vigil.inventory = inventory
            body(c, *a, **kw)

        run.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[*params[:at], param, *params[at:]])
        helps = dict(kwargs.pop("help", None) or {})
        helps.setdefault("inventory", INVENTORY_HELP)
        return VigilTask(run, help=helps, **kwargs)

    return decorate


def project_of(c: Context) -> project.Project:
    """The ops repository the command runs in (its vigil.yaml), found from the working
    directory each time: nothing is read from vigil's own installation."""
    return project.find(Path.cwd())


def setting(c: Context, key: str) -> Path:
    """A path setting (inventory, state_dir): relative ones are the project root's."""
    p = project_of(c)
    return p.path(str(project.value(p, c.config.vigil, key)))


def out_path(c: Context, value: str) -> Path:
    """Where a report flag (--json, --junit, --html, --out) writes: relative to the root."""
    return project_of(c).path(value)


# --json on every task that reports: bare (last, or before another flag) the JSON is all
# that stdout gets, and the task's text goes to stderr; with a value, that file.
JsonFlag = str | bool | None


def json_help(what: str) -> str:
    return (f"write {what} as JSON to this file; a bare --json (last, or before another "
            "flag) prints it on stdout instead, and the text on stderr")


def text_stream(json: JsonFlag) -> TextIO:
    """Where a task prints its text: stderr when its JSON has stdout (a bare --json)."""
    return sys.stderr if json is True or json == "-" else sys.stdout


def emit_json(c: Context, json: JsonFlag, payload: Any) -> None:
    """A task's --json: nothing (not given), stdout (bare) or the named file (relative to
    the project root, written whole or not at all)."""
    if json is True or json == "-":  # `--json -` is stdout, as for every Unix tool
        # ASCII-only (json's escapes), so nothing for echo's cleaning to change
        echo(json_mod.dumps(payload, indent=2, default=str))
    elif json:
        write_json(str(out_path(c, json)), payload)


def roles_dirs(c: Context) -> list[Path]:
    """The ops repo's roles folder; the built-in roles come after it (desired/roles)."""
    return [setting(c, "roles")]


def template_dirs(c: Context) -> list[Path]:
    """The service templates' search path: the configured folder (or the ops repo's
    roles/service/templates), then the built-in ones; the first holding a name wins."""
    p = project_of(c)
    configured = project.value(p, c.config.vigil, "templates")
    first = p.path(str(configured)) if configured is not None else \
        setting(c, "roles") / "service" / "templates"
    from vigil.desired.render import TEMPLATES

    return [first, TEMPLATES]


def watch_settings(c: Context, poll: float | None = None,
                   stall: float | None = None, probe: str | None = None) -> Settings:
    """The watcher's settings, read here once from the Invoke config (``vigil.poll_s``,
    ``vigil.history_min_samples``, ``vigil.probe``) with --poll/--stall/--probe on top:
    deploy, verify and rollback watch a start the same way."""
    p = project_of(c)
    cfg = {k: project.value(p, c.config.vigil, k) for k in ("poll_s", "history_min_samples",
                                                            "probe")}
    try:
        # unset: each host's own poll_s (the verify role's default, or the inventory's)
        chosen = poll if poll is not None else cfg.get("poll_s")
        poll_s = None if chosen is None else float(chosen)
        min_samples = int(cfg["history_min_samples"])
    except (TypeError, ValueError):
        raise ConfigError("not a number", key="vigil.poll_s/history_min_samples",
                          fix="set numbers in vigil.yaml") from None
    bad_poll = poll_s is not None and poll_s <= 0
    if bad_poll or (stall is not None and stall <= 0) or min_samples < 1:
        raise ConfigError("--poll and --stall must be positive seconds and "
                          "history_min_samples at least 1", key="--poll/--stall",
                          fix="e.g. --poll 5 --stall 60")
    mode = str(probe if probe is not None else cfg["probe"])
    if mode not in ("stream", "poll"):
        raise ConfigError(f"probe must be stream or poll, not {mode!r}",
                          key="--probe/vigil.probe", fix="--probe poll (or stream)")
    from vigil.verify.watch import Settings

    return Settings(poll_s=poll_s, stall_s=stall, min_samples=min_samples,
                    stream=mode == "stream")


def worst_code(codes: Iterable[int]) -> int:
    """The most important of the hosts' exit codes (SEVERITY; none: 0)."""
    return worst(codes)


def exit_with(codes: Iterable[int]) -> None:
    """End the task with the most important of its hosts' exit codes (none: 0)."""
    code = worst_code(codes)
    if code:
        raise Exit(code=code)


def load_inventory(c: Context) -> inventory.Inventory:
    """The inventory; what it holds and vigil does not read is said on stderr."""
    from vigil.desired import inventory

    inv = inventory.load(setting(c, "inventory"), roles_dirs(c))
    for line in inv.warnings:
        echo(f"warning: {line}", file=sys.stderr)
    # what resolving a host finds (ssh config options vigil does not follow), once each
    inv.notes.sink = lambda line: echo(f"warning: {line}", file=sys.stderr)
    return inv


def checked_inventory(c: Context, hosts: str) -> inventory.Inventory:
    """The inventory, once every host `hosts` selects has its inputs (variables, key and
    known_hosts files): nothing is contacted when one of them would fail."""
    inv = load_inventory(c)
    inv.check_inputs(hosts)
    return inv


@contextmanager
def user_errors() -> Iterator[None]:
    """A user mistake prints one clear message and exits with its code; no traceback."""
    try:
        yield
    except VigilError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        raise Exit(code=int(exc.exit_code)) from None


def parallel(items: Iterable[T], work: Callable[[T], None]) -> None:
    """Run `work` on every item in its own thread and wait for all of them. An exception
    that escapes `work` (a bug) is raised here once all are done, not lost with its
    thread."""
    crashed: list[VigilError] = []

    def guarded(item: T) -> None:
        try:
            work(item)
        except Exception as exc:
            crashed.append(exc if isinstance(exc, VigilError)
                           else InternalError.of(str(item), exc))

    threads = [threading.Thread(target=guarded, args=(item,)) for item in items]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if crashed:
        raise crashed[0]
