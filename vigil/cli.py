"""The ``vigil`` command: Invoke's Program over vigil's collection, with CLI manners a
user expects of an installed tool: usage errors exit 2 (1 means a host failed) and name
the closest task."""

from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Any

from invoke.exceptions import ParseError
from invoke.parser.argument import Argument
from invoke.program import Program
from invoke.vendor.lexicon import Lexicon

from vigil import __version__
from vigil.exitcodes import ExitCode
from vigil.tasks.collection import ns

_UNKNOWN = re.compile(r"^No idea what '([^']+)' is!$")
# Invoke's core options for tasks that run shell commands here (c.run): vigil's tasks run
# none, so these would be accepted and do nothing (--dry deployed for real). They are
# not offered; Invoke's own code still reads them, so it gets their defaults.
_INERT = frozenset({"command-timeout", "dry", "echo", "hide", "prompt-for-sudo-password",
                    "pty", "warn-only", "write-pyc"})
# What an option of Invoke's or Ansible's means in vigil, said instead of "No idea".
_INSTEAD = {
    "--dry": "vigil has no --dry: `vigil deploy --check` shows the plan and every diff and "
             "changes nothing",
    "-R": "vigil has no -R (Invoke's --dry): `vigil deploy --check` shows the plan and "
          "changes nothing",
    "--extra-vars": "vigil's extra variables are --set KEY=VALUE (-e)",
    "--diff": "`vigil deploy --check` shows the diff of every file it would write",
    "-D": "`vigil deploy --check` shows the diff of every file it would write",
    "--user": "the SSH user is ssh_user (or ansible_user) in the inventory, or --set "
              "ssh_user=NAME",
    "-u": "the SSH user is ssh_user (or ansible_user) in the inventory, or --set "
          "ssh_user=NAME",
    "-v": "vigil has no -v: its log says each step; --debug adds Invoke's own",
    "-K": "vigil does not prompt for a sudo password: sudo: true needs passwordless sudo",
    "-l": "-l is Ansible's --limit, which is --hosts: give it after the task (`vigil "
          "deploy -l gpu-01`); --list lists the tasks",
    "-f": "-f is Ansible's --forks: give it after the task (`vigil deploy -f 10`); "
          "Invoke's config file is --config",
    "--ask-become-pass": "vigil does not prompt for a sudo password: sudo: true needs "
                         "passwordless sudo",
}


class VigilProgram(Program):
    """Invoke's Program with only the core options vigil honours, short flags that mean
    no other thing to an Ansible user, and usage errors that say what was meant."""

    usage_error = False

    def core_args(self) -> list[Argument]:
        out = []
        for arg in super().core_args():
            if arg.name in _INERT:
                continue
            # -f is Ansible's forks, -l its --limit, -D its --diff: no core short flag
            # but -h and -V
            arg.names = tuple(n for n in arg.names if len(n) > 1 or n in ("h", "V"))
            out.append(arg)
        return out

    @property
    def args(self) -> Lexicon:
        parsed: Lexicon = self.core[0].args
        for arg in super().core_args():
            if arg.name in _INERT and arg.name not in parsed:
                parsed[arg.name] = arg  # its default: never given, never parsed
        return parsed

    def _parsing(self, step: Any) -> None:
        try:
            step()
        except ParseError as exc:
            self.usage_error = True
            m = _UNKNOWN.match(str(exc))
            token = m.group(1) if m else ""
            if token in _INSTEAD:
                raise ParseError(f"{exc} {_INSTEAD[token]}") from None
            if token.startswith("-"):
                raise ParseError(f"{exc}{self._flag_hint(token, exc)}") from None
            names = list(self.collection.task_names) if self.collection is not None else []
            close = difflib.get_close_matches(token, names, n=1) if m else []
            if close:
                raise ParseError(f"{exc} Did you mean '{close[0]}'? "
                                 f"(`{self.binary} --list` lists every task)") from None
            raise

    def _flag_hint(self, token: str, exc: ParseError) -> str:
        """The closest flag of the task being parsed (or of the core options)."""
        context = getattr(exc, "context", None)
        flags = [str(f) for f in getattr(context, "flags", {})] if context else []
        task = getattr(context, "name", None)
        flags += [str(f) for f in self.initial_context.flags]
        close = difflib.get_close_matches(token, flags, n=1, cutoff=0.6)
        where = f"`{self.binary} {task} --help`" if task else f"`{self.binary} --help`"
        said = f" Did you mean '{close[0]}'?" if close else ""
        return f"{said} ({where} lists its flags)"

    def parse_core(self, argv: list[str] | None) -> None:
        self._parsing(lambda: super(VigilProgram, self).parse_core(argv))

    def parse_tasks(self) -> None:
        self._parsing(super().parse_tasks)

    def parse_cleanup(self) -> None:
        self._parsing(super().parse_cleanup)

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        try:
            super().run(init_here(help_first(list(sys.argv if argv is None else argv))),
                        exit)
        except SystemExit as done:
            if self.usage_error:
                raise SystemExit(int(ExitCode.BAD_INPUT)) from None
            raise done


def help_first(argv: list[str]) -> list[str]:
    """`vigil TASK ... --help` (or -h) is `vigil --help TASK`: Invoke would otherwise hand
    --help to a positional argument still unfilled (`replay --help`: cannot read --help)
    or to a flag's value."""
    names = set(ns.task_names)
    task = next((i for i, word in enumerate(argv[1:], 1) if word in names), None)
    if task is not None and any(w in ("--help", "-h") for w in argv[task + 1:]):
        return [argv[0], "--help", argv[task]]
    return argv


def init_here(argv: list[str]) -> list[str]:
    """`vigil init` with no DIR is `vigil init .`, as its help says: Invoke requires every
    positional argument, so "." goes in before it parses (issue 29.10)."""
    names = set(ns.task_names)
    task = next((i for i, word in enumerate(argv[1:], 1) if word in names), None)
    if task is None or argv[task] != "init":
        return argv
    takes_value = {f"--{a.name.replace('_', '-')}" for a in ns["init"].get_arguments()
                   if a.kind is not bool} | {f"-{n}" for a in ns["init"].get_arguments()
                                              if a.kind is not bool for n in a.names
                                              if len(n) == 1}
    rest = argv[task + 1:]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in names:
            break  # the next task
        if word.startswith("-"):
            i += 2 if word in takes_value else 1
            continue
        return argv  # DIR given
    return [*argv[:task + 1], ".", *rest]


program = VigilProgram(namespace=ns, name="vigil", binary="vigil", version=__version__)


def main() -> None:
    try:
        program.run(sys.argv)
    except BrokenPipeError:
        # `vigil render ... | head`: the reader left; say nothing more, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
