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
from invoke.program import Program

from vigil import __version__
from vigil.exitcodes import ExitCode
from vigil.tasks.collection import ns

_UNKNOWN = re.compile(r"^No idea what '([^']+)' is!$")


class VigilProgram(Program):
    usage_error = False

    def _parsing(self, step: Any) -> None:
        try:
            step()
        except ParseError as exc:
            self.usage_error = True
            m = _UNKNOWN.match(str(exc))
            names = list(self.collection.task_names) if self.collection is not None else []
            close = difflib.get_close_matches(m.group(1), names, n=1) if m else []
            if close:
                raise ParseError(f"{exc} Did you mean '{close[0]}'? "
                                 f"(`{self.binary} --list` lists every task)") from None
            raise

    def parse_core(self, argv: list[str] | None) -> None:
        self._parsing(lambda: super(VigilProgram, self).parse_core(argv))

    def parse_tasks(self) -> None:
        self._parsing(super().parse_tasks)

    def parse_cleanup(self) -> None:
        self._parsing(super().parse_cleanup)

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        try:
            super().run(help_first(list(sys.argv if argv is None else argv)), exit)
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


program = VigilProgram(namespace=ns, name="vigil", binary="vigil", version=__version__)


def main() -> None:
    try:
        program.run(sys.argv)
    except BrokenPipeError:
        # `vigil render ... | head`: the reader left; say nothing more, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
