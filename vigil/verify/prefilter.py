"""Replay's prefilter: the lines of a plain log that no rule can match, found in one
compiled pass, so a day of serving lines after a start's verdict skips the reducer.

The pass is derived from the catalog's own rules, never written beside them: every
compiled pattern of the classifier's module (vigil/verify/catalog/classify.py, minus the
few named in `_INERT_ONCE_DECIDED`), every cause's wordings and hints, every phase's
markers, every wait's wordings, and the reducer's own line tests (a traceback's header,
systemd's exit line). Each pattern keeps its own flags and anchors and runs on the line's
message, as the classifier runs it; one alternation of them all is compiled once. A rule
added to any of those tables is in the pass the next time vigil starts.

The pass runs on the text the classifier reads: `normalise`d (vigil.verify.catalog), then
vLLM's prefix split off. Normalising costs more than the rest of the pass, so a line the
normaliser provably leaves as it is (`verbatim`: no escape, caret, CR, tag, gutter or
border character, and either no process prefix or one already written as vLLM writes it)
is not normalised; any other line is. tests/unit/test_prefilter.py checks that claim on
every corpus line.

A line may skip the reducer only where it would change nothing the replay reports
(`settled`): the start has a final verdict, began, served (ready), and no line-carried
memory is open (an ERROR line a traceback may follow, a dying child's header, a wait, an
offline batch done). There a line that passes no rule (kind "other" or, once serving,
"serving"; below ERROR) changes only `last_line`, which only a stall's proof shows, and a
stall is never decided after a verdict. From the first line that passes, the rest of that
poll goes to the reducer whole (attempts.run).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import Any

from vigil.verify import catalog
from vigil.verify.catalog import lines as _lines
from vigil.verify.catalog import waits as _waits
from vigil.verify.reducer import TERMINAL, Verdict, WatchState
from vigil.verify.reducer import log as _log
from vigil.verify.reducer import state as _state

# the module: the package's name `classify` is its function
_classify = importlib.import_module("vigil.verify.catalog.classify")
# the regex parser the re module compiles with (no stubs: read as Any)
_p: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

# Patterns of the classifier's module that only say what is inert once a start is decided
# and served (see `settled`): serving evidence (its first line decides ready; later ones
# change nothing), and the phase a line proves (`reached`: phases move only before a
# verdict) from a process name, a frame or a worker method. Every frame line passes
# anyway (_FRAME_ANY is in the pass).
_INERT_ONCE_DECIDED = frozenset({
    "_SERVING", "_PROC_PHASE", "_CHILD_PROC", "_FRAME", "_WORKER_METHOD",
    "_TORCH_CAPTURE", "_TORCH_RENDEZVOUS"})


def _patterns() -> Iterator[tuple[str, re.Pattern[str]]]:
    """(where, pattern) of every rule a line's message can meet."""
    for name, value in vars(_classify).items():
        if isinstance(value, re.Pattern) and name not in _INERT_ONCE_DECIDED:
            yield f"classify.{name}", value
    for cause, hint in _classify._HINTS:
        yield f"hints of {cause.id}", hint
    for cause in catalog.CAUSES:
        yield f"cause {cause.id}", cause.regex
    for phase in catalog.PHASE_RECORDS:
        for marker in phase.markers:
            yield f"marker {marker.name}", marker.pattern
    for wait in (*catalog.WAITS, *_waits._RETRIES):
        yield f"wait {wait.id}", wait.pattern
    yield "a traceback's header", re.compile(re.escape(_log._TRACEBACK))


def _factors(items: Any) -> set[str] | None:
    """Strings one of which every match of this parsed pattern contains (its longest
    required literals), or None where it needs none: a run of literal characters, or
    what a group, a repeat of at least one or each branch of an alternation requires."""
    best: set[str] | None = None
    run = ""

    def consider(found: set[str] | None) -> None:
        nonlocal best
        if found and (best is None or min(map(len, found)) > min(map(len, best))):
            best = found

    for op, av in items:
        if op is _c.LITERAL:
            run += chr(av)
            continue
        consider({run} if run else None)
        run = ""
        if op is _c.SUBPATTERN:
            consider(_factors(av[3]))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT) and av[0] >= 1:
            consider(_factors(av[2]))
        elif op is _c.ATOMIC_GROUP:
            consider(_factors(av))
        elif op is _c.BRANCH:
            union: set[str] = set()
            for branch in av[1]:
                found = _factors(branch)
                if found is None:
                    break
                union |= found
            else:
                consider(union)
    consider({run} if run else None)
    return best


def factors(pattern: re.Pattern[str]) -> set[str] | None:
    """The literals one of which any match of ``pattern`` contains; None: none known (a
    pattern of classes and repeats only, or one that ignores case)."""
    if pattern.flags & re.IGNORECASE:
        return None
    return _factors(_p.parse(pattern.pattern, pattern.flags))


def _trie(words: set[str]) -> str:
    """One regex matching any of ``words``, as a trie (one branch per next character:
    an alternation of hundreds of words would try each at every position)."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        if "" in node:  # a word ends here: the rest is optional, the shorter one suffices
            return ""
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


# Every digit read as "0": serving lines differ mostly in their numbers (ports, tokens/s),
# so the pass is asked once per shape. A factor found in a message is found, so read, in
# the message so read (the factors are read so too).
_DIGITS = str.maketrans("123456789", "000000000")


def _shape(text: str) -> str:
    return text.translate(_DIGITS)


RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(_patterns())
FACTORS: dict[str, set[str] | None] = {where: factors(p) for where, p in RULES}


def _fewest(found: set[str]) -> set[str]:
    """Without the strings that contain another of them (the shorter one suffices)."""
    return {f for f in found if not any(g != f and g in f for g in found)}


# A rule with no literal a match must contain passes every line (correct, and slow).
PASS = re.compile("" if any(f is None for f in FACTORS.values()) else _trie(_fewest(
    {_shape(f) for found in FACTORS.values() if found is not None for f in found})))
_SHAPES: dict[str, bool] = {}  # shape -> whether it passes; bounded (cleared when full)
_MAX_SHAPES = 4096
# Tests on the whole line, not its message: systemd's exit line (the reducer's) and
# its unit lines (the start splitter's).
_WHOLE = re.compile("|".join(f"(?:{p})" for p in (
    _state._SYSTEMD_EXIT.pattern, r"\.service: ")))

# Characters some step of `normalise` reacts to; a line without any is left as it is, but
# for a process prefix (handled by `_PREFIX_AS_WRITTEN`).
_TOUCHED = re.compile("[\x1b\r^<|\u2502\u2503]")
# A prefix as vLLM writes one ("(APIServer pid=1) "), and no second one after it (a
# second would start with "(", or "[" or a digit: a colour remnant before it).
_PREFIX_AS_WRITTEN = re.compile(r"\([A-Za-z][\w\-]* pid=\d+\) (?=[^\s(\[\d])")
_STARTS_LIKE_WRAPPER = re.compile(r"\d|[(\[]")


def verbatim(text: str) -> bool:
    """Whether ``normalise(text) == text`` is certain without running it: none of the
    characters its steps react to (ANSI and caret escapes, CR, HTML tags, gutters and
    borders, a colour remnant after a bracket, Ray's "repeated", leading space), and the
    text starts with a letter or with one process prefix already written as vLLM writes
    it, followed by one space and neither another prefix nor what a colour remnant
    starts with."""
    if _TOUCHED.search(text) is not None or ")[" in text or "repeated" in text \
            or text[:1].isspace():
        return False
    if text[:1] == "(":
        return _PREFIX_AS_WRITTEN.match(text) is not None
    return _STARTS_LIKE_WRAPPER.match(text) is None


def settled(st: WatchState) -> bool:
    """A start whose lines from now on change nothing replay reports unless a rule
    matches them (see the module's docstring)."""
    ready = st.verdict == Verdict.READY
    return (st.verdict in TERMINAL and st.begun and st.error_line is None
            and st.child_died is None and st.waiting is None and st.offline_idle_at is None
            and (not ready or (st.serving_at is not None and st.phase == "ready")))


def passes(text: str) -> bool:
    """Whether a rule may match this line (its raw text as the reducer gets it): False
    only for a line that provably matches none, at a level below ERROR."""
    if _WHOLE.search(text) is not None:
        return True
    clean = text if verbatim(text) else catalog.normalise(text)
    m = _lines._PREFIX.match(clean)
    if m is None or (m["level"] is None and m["proc"] is None):
        line = catalog.parse_line(clean)  # glog, a custom format: parse it whole
        level, msg = line.level, line.message
    else:
        level, msg = m["level"], m["msg"].strip()
    if level in ("ERROR", "CRITICAL"):
        return True
    shape = _shape(msg)
    hit = _SHAPES.get(shape)
    if hit is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        hit = _SHAPES[shape] = PASS.search(shape) is not None
    return hit
