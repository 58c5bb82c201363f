"""The log catalog: what vLLM's log lines mean for a watcher.

Pure: text in, meaning out. Two records hold everything a watcher knows, one entry per
concept, so adding a phase or a cause is one edit here:

- `Phase`: its name and label, default budget and stall window, which progress signals
  count in it, the hint when it stalls, the log markers that open/advance/close it, and
  the traceback frames that prove a start got that far.
- `Cause`: every wording seen (vLLM rewords its fatal messages across releases, V0 and
  V1 word them differently), the vLLM versions they were seen in, the remedy, what the
  remedy needs from the line, and its role: a root cause, a symptom (something died
  further down) or a link of the failure chain ("… failed to start").

- `Wait`: a wait that can never end, the phase it proves and the cause it names.

One module each (phases, causes, waits), then how a line is read (lines) and what it
means (classify), and where a start begins (starts); this package's names are the
catalog's. Patterns match fragments, not whole lines. Order matters only inside a table.
"""

from __future__ import annotations

from vigil.verify.catalog.causes import (
    CAUSE,
    CAUSES,
    VERDICT_REMEDIES,
    Cause,
)
from vigil.verify.catalog.classify import (
    CHILD_DIED,
    Match,
    classify,
    is_specific,
    is_traceback_link,
    remedy_for,
    role_of,
    runs_in,
    wraps_another,
)
from vigil.verify.catalog.lines import (
    Line,
    normalise,
    parse_line,
    strip_ansi,
)
from vigil.verify.catalog.phases import (
    ALWAYS,
    PHASE,
    PHASE_RECORDS,
    PHASES,
    SIGNALS,
    Edge,
    Kind,
    Marker,
    Phase,
    Role,
    phase_index,
)
from vigil.verify.catalog.starts import (
    START_KINDS,
    StartLine,
    start_line,
)
from vigil.verify.catalog.waits import (
    WAIT,
    WAITS,
    Wait,
)

__all__ = [
    "ALWAYS",
    "CAUSE",
    "CAUSES",
    "CHILD_DIED",
    "PHASE",
    "PHASES",
    "PHASE_RECORDS",
    "SIGNALS",
    "START_KINDS",
    "VERDICT_REMEDIES",
    "WAIT",
    "WAITS",
    "Cause",
    "Edge",
    "Kind",
    "Line",
    "Marker",
    "Match",
    "Phase",
    "Role",
    "StartLine",
    "Wait",
    "classify",
    "is_specific",
    "is_traceback_link",
    "normalise",
    "parse_line",
    "phase_index",
    "remedy_for",
    "role_of",
    "runs_in",
    "start_line",
    "strip_ansi",
    "wraps_another",
]
