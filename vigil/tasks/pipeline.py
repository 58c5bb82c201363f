"""What a CI/CD pipeline shows of a run, written by vigil itself so a recipe needs no glue:
under GitHub Actions, the recap as a table in the job summary (``$GITHUB_STEP_SUMMARY``)
and one ``::error::`` annotation per failed host. Elsewhere nothing (the recap is on
stdout, JUnit with --junit).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from vigil.report import HostResult, HostStatus, failed_word, result_word, safe_text

if TYPE_CHECKING:  # a task's libraries load when it runs, not at `vigil --help`
    from vigil.verify.watch import Outcome


@dataclass(frozen=True)
class Row:
    host: str
    result: str  # ok, changed, failed, ready, crashed, ...
    detail: str
    failed: bool


def deploy_rows(results: Iterable[HostResult]) -> list[Row]:
    rows = []
    for r in results:
        done = ", ".join(a.split(":", 1)[0] for a in r.actions)
        detail = (r.error.splitlines() or [""])[0] if r.error else done or "nothing to do"
        # a start that failed its watch says how (crashed, stalled) rather than "failed"
        result = r.verdict if r.status == HostStatus.FAILED and r.verdict else result_word(r)
        rows.append(Row(r.host, result, detail, r.status == HostStatus.FAILED))
    return rows


def verify_rows(outcomes: Iterable[Outcome]) -> list[Row]:
    from vigil.verify.reducer import Verdict

    rows = []
    for o in outcomes:
        st = o.state
        if o.error is not None or st is None:
            rows.append(Row(o.host, failed_word(o.exit_code, "error"),
                            (o.error or "no verdict").splitlines()[0], True))
            continue
        detail = " - ".join(str(x) for x in (st.cause, st.proof or st.remedy) if x)
        rows.append(Row(o.host, str(st.verdict), detail or str(st.phase or ""),
                        st.verdict != Verdict.READY))
    return rows


def _cell(text: str) -> str:
    """One table cell of the job summary (GitHub-flavoured Markdown, which renders HTML):
    safe_text as everywhere (bidi overrides, lone surrogates too), one line, ``&`` and
    ``<`` as entities (no tag of a host's renders: an <img> pixel, an <a> link), and
    every backslash and pipe escaped (a host's ``\\|`` would else end the cell)."""
    text = safe_text(text).replace("\n", " ").replace("&", "&amp;").replace("<", "&lt;")
    return re.sub(r"([\\|])", r"\\\1", text)


def _message(text: str) -> str:
    """A workflow command's data: GitHub's own escapes, then vigil's (safe_text)."""
    escaped = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return safe_text(escaped)


def _property(text: str) -> str:
    return _message(text).replace(":", "%3A").replace(",", "%2C")


def report(task: str, rows: list[Row], environ: Mapping[str, str] | None = None,
           stream: TextIO | None = None) -> str:
    """Annotate and summarise for the pipeline the run is in; returns what it printed
    (to ``stream``, stdout by default: the runner reads workflow commands on stderr too,
    where a task prints its text while its JSON has stdout)."""
    env = os.environ if environ is None else environ
    if env.get("GITHUB_ACTIONS") != "true":
        return ""
    printed = [f"::error title={_property(f'vigil {task}: {r.host}')}::"
               f"{_message(f'{r.host} {r.result}: {r.detail}')}" for r in rows if r.failed]
    if printed:
        print("\n".join(printed), file=stream or sys.stdout, flush=True)
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        failed = sum(r.failed for r in rows)
        lines = [f"### vigil {task}: {len(rows) - failed} of {len(rows)} hosts fine", "",
                 "| host | result | detail |", "|---|---|---|"]
        lines += [f"| {_cell(r.host)} | {'❌ ' if r.failed else ''}{_cell(r.result)} | "
                  f"{_cell(r.detail)} |" for r in rows]
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n\n")
    return "\n".join(printed)
