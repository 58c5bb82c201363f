"""Property tests (hypothesis) for what hostile input reaches: the quoting of unit words,
environment files and shell commands; the log, journal and history parsers; the inventory
loader; the masking of secrets (issue 8); the terminal neutraliser and every report writer
(issue 21: JUnit parses, HTML gains no tag, JSON loads back, a pipeline gets one annotation
and three cells a row, whatever a host says).

The quoting properties parse vigil's output back with reference parsers written from
systemd's and bash's rules (and, for the shell, with bash itself): every value survives
as exactly one word, and no value can become a specifier, a variable or a second word.
"""

from __future__ import annotations

import io
import json
import math
import shlex
import subprocess
import tempfile
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vigil.desired import inventory
from vigil.desired.ansible import MAX_RANGE, expand_range
from vigil.desired.config import NAME, HostVars
from vigil.desired.render import MASK, env_quote, redact_env_text, systemd_quote
from vigil.errors import ConfigError
from vigil.transport.base import privileged
from vigil.transport.hostkeys import host_matches
from vigil.verify import history, replay

# What the models let through to a unit or an env file: no C0/C1 control characters,
# no U+2028/U+2029 (vigil.desired.config._SAFE_TEXT).
SAFE = st.text(st.characters(blacklist_categories=("Cs",),
                             blacklist_characters=[chr(c) for c in range(0x20)]
                             + [chr(c) for c in range(0x7f, 0xa0)] + ["\u2028", "\u2029"]))
# What a shell word can hold: anything but NUL.
SHELL = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
FAST = settings(max_examples=300, deadline=None)

# -- systemd's ExecStart: specifiers, then quoted words with C escapes, then $ ------------------

_WS = " \t\n\r"


def _specifiers(line: str) -> str:
    out, i = [], 0
    while i < len(line):
        if line[i] == "%":
            assert line[i + 1:i + 2] == "%", f"a specifier %{line[i + 1:i + 2]} in {line!r}"
            out.append("%")
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def _dollars(word: str) -> str:
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            assert word[i + 1:i + 2] == "$", f"a variable ${word[i + 1:i + 5]} in {word!r}"
            out.append("$")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def systemd_words(line: str) -> list[str]:
    """ExecStart= as systemd reads it (unit_full_printf, extract_first_word with
    EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE, then replace_env_argv); fails on anything vigil
    must never produce (a specifier, a variable, an unquoted word, another escape)."""
    text = _specifiers(line)
    words, i = [], 0
    while i < len(text):
        if text[i] in _WS:
            i += 1
            continue
        assert text[i] == '"', f"an unquoted word at {text[i:i + 20]!r}"
        i += 1
        word: list[str] = []
        while text[i] != '"':
            if text[i] == "\\":
                assert text[i + 1] in '\\"', f"escape \\{text[i + 1]}"
                word.append(text[i + 1])
                i += 2
            else:
                word.append(text[i])
                i += 1
        i += 1
        assert i == len(text) or text[i] in _WS, "text right after a closing quote"
        words.append(_dollars("".join(word)))
    return words


@FAST
@given(st.lists(SAFE, min_size=1, max_size=6))
def test_exec_start_words_come_back_exactly(words: list[str]) -> None:
    line = " ".join(systemd_quote(w) for w in words)
    assert "\n" not in line
    assert systemd_words(line) == words


@FAST
@given(SAFE)
def test_an_option_value_never_becomes_an_option(value: str) -> None:
    # vllm_argv writes --flag=value as one word: a value like "x --trust-remote-code"
    # stays inside it
    assert systemd_words(systemd_quote(f"--served-model-name={value}")) == [
        f"--served-model-name={value}"]


# -- EnvironmentFile= values ------------------------------------------------------------------


def env_file_value(raw: str) -> str:
    """One value as systemd's EnvironmentFile parser reads it (parse_env_file_internal):
    '...' literal; "..." with \\ before one of "\\`$ taken literally."""
    if raw.startswith("'"):
        assert raw.endswith("'") and len(raw) >= 2 and "'" not in raw[1:-1]
        return raw[1:-1]
    assert raw.startswith('"') and raw.endswith('"') and len(raw) >= 2
    out, i, body = [], 0, raw[1:-1]
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            out.append(nxt if nxt in '"\\`$' else "\\" + nxt)
            i += 2
        else:
            assert c != '"', "an unescaped quote ends the value early"
            out.append(c)
            i += 1
    return "".join(out)


@FAST
@given(SAFE)
def test_env_file_values_come_back_exactly(value: str) -> None:
    quoted = env_quote(value)
    assert "\n" not in quoted
    assert env_file_value(quoted) == value


# -- shell quoting ------------------------------------------------------------------------------


SUDO = HostVars.model_validate({"ssh_user": "deploy", "sudo": True})


@FAST
@given(SHELL)
def test_privileged_keeps_the_command_one_word(command: str) -> None:
    assert shlex.split(privileged(command, SUDO)) == ["sudo", "-n", "--", "bash", "-c",
                                                      command]


@settings(max_examples=60, deadline=None)
@given(SHELL)
def test_bash_reads_a_quoted_word_back_exactly(value: str) -> None:
    # the way host_lock passes LOCK/OWNER: VAR=<quoted> bash -c '...'
    script = f'OWNER={shlex.quote(value)} bash -c \'printf %s "$OWNER"\''
    out = subprocess.run(["bash", "-c", script], capture_output=True, timeout=30).stdout
    assert out == value.encode("utf-8", "surrogateescape")


# -- secrets in shown env files -----------------------------------------------------------------


@FAST
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
               min_size=8),
       st.sampled_from(["HF_TOKEN", "DB_PASS", "X", "export WANDB_KEY"]))
def test_a_value_not_rendered_in_the_open_never_shows(secret: str, name: str) -> None:
    public_line = "VLLM_LOGGING_LEVEL='INFO'"
    assume(secret not in public_line and secret not in name)
    # nor in the redaction's own words: a "secret" '(a line)' is the mask's label, no leak
    assume(secret not in f"(a line) {MASK} (hash ")
    host_text = f"# comment\n{public_line}\n{name}={secret}\nraw {secret} line\n"
    shown = redact_env_text(host_text, frozenset({"VLLM_LOGGING_LEVEL"}),
                            frozenset({"# comment"}), b"k")
    assert secret not in shown
    assert public_line in shown and "# comment" in shown


# -- log, journal and history parsers ---------------------------------------------------------


@FAST
@given(st.text())
def test_a_log_line_splits_without_error(raw: str) -> None:
    t, text = replay.split_log_line(raw)
    assert t is None or (math.isfinite(t) and t >= 0)
    # the text is the line cleaned (prefixes, colour, a redraw or the line end taken
    # off by the one normaliser): never longer, never a character the line lacks
    assert len(text) <= len(raw) and set(text) <= set(raw)


@FAST
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                      blacklist_characters="\n")), max_size=30))
def test_every_log_line_lands_in_a_snapshot_in_order(lines: list[str]) -> None:
    stamped = [f"INFO 11-29 10:{i // 60:02d}:{i % 60:02d} [x.py:1] {line}"
               if i % 3 else line for i, line in enumerate(lines)]
    snaps = list(replay.snapshots_from_log(stamped))
    kept = [line for line in stamped if line.strip()]
    assert sum(len(s.journal.lines) for s in snaps) == len(kept)
    times = [s.time for s in snaps if s.time]
    assert times == sorted(times)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=10,
)


@FAST
@given(st.lists(st.fixed_dictionaries({}, optional={
    "MESSAGE": JSONISH | st.lists(st.integers(-5, 300), max_size=8),
    "__REALTIME_TIMESTAMP": JSONISH | st.integers(0, 10**18).map(str),
}), max_size=8))
def test_journal_records_parse_or_give_one_clear_error(records: list[dict[str, Any]]) -> None:
    try:
        snaps = list(replay.snapshots_from_journal_json(records))
    except ConfigError:
        return
    assert all(s.time >= 0 for s in snaps)


@FAST
@given(st.lists(JSONISH.map(json.dumps) | st.text(), max_size=10))
def test_history_lines_never_raise(lines: list[str]) -> None:
    text = "\n".join(lines)
    records, bad = history.parse_lines(text)
    assert len(records) + bad == len([line for line in text.split("\n") if line.strip()])


# -- the inventory loader -------------------------------------------------------------------


KEYS = st.sampled_from([*sorted(HostVars.model_fields), "host_key_check", "nonsense"])
YAML_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | SHELL,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(SAFE, inner, max_size=3),
    max_leaves=8,
)
HOSTS_FILE = st.fixed_dictionaries({
    "hosts": st.dictionaries(st.text(min_size=1, max_size=12) | st.integers(),
                             st.none() | st.dictionaries(KEYS, YAML_VALUE, max_size=4),
                             max_size=3),
}, optional={"groups": st.dictionaries(st.text(min_size=1, max_size=8), st.fixed_dictionaries(
    {}, optional={"hosts": st.lists(st.text(max_size=8), max_size=3),
                  "vars": st.dictionaries(KEYS, YAML_VALUE, max_size=3)}), max_size=2)})


def _load_all(hosts_yml: str, name: str = "hosts.yml") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / name).write_text(hosts_yml)
        try:
            inv = inventory.load(root)
            for name in inv.hosts:
                hv = inv.host_vars(name)
                assert NAME.match(name)
                for key in ("known_hosts", "ssh_key"):
                    value = getattr(hv, key)
                    assert value is None or isinstance(value, str)
        except ConfigError:
            pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTS_FILE)
def test_any_hosts_file_loads_or_gives_one_clear_error(data: dict[str, Any]) -> None:
    _load_all(yaml.safe_dump(data, allow_unicode=True))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_as_hosts_yml_loads_or_gives_one_clear_error(text: str) -> None:
    _load_all(text)


# Ansible's shapes (issue 22): INI lines and all:/children:/hosts:/vars: trees, both
# made of the pieces a real one has, so most examples get past the first check.
INI_LINE = st.sampled_from([
    "[gpu]", "[gpu:vars]", "[gpu:children]", "[all:vars]", "[fleet:children]", "gpu",
    "h1", "h[1:3] ansible_port=2222", "h[01:03]", "h[a:c] ansible_become=yes",
    "h2 ansible_host=10.0.0.2 port=8001", "port=8000", "ansible_user = root  # c",
    "gpu={'kind': 'x', 'count': 1, 'memory_gib': 9}", "sudo=maybe", "[bad", "h3 x='open",
    "ansible_group_priority=2", "; comment", "h[5:1]", "[x:bogus]", "rack=4",
]) | st.text(max_size=20)
GROUP_NAME = st.sampled_from(["all", "gpu", "fleet", "ungrouped", "h1"]) | st.text(max_size=6)
HOST_VARS = st.none() | st.dictionaries(
    st.sampled_from(["ansible_host", "ansible_port", "ansible_user", "ansible_become",
                     "address", "port", "rack", "ansible_python_interpreter"]),
    YAML_VALUE, max_size=3)
GROUP = st.recursive(
    st.none() | st.fixed_dictionaries({}, optional={
        "hosts": st.dictionaries(st.sampled_from(["h1", "h[1:2]", "h[a:b]", "g[0:9:4]"])
                                 | st.text(max_size=6), HOST_VARS, max_size=3),
        "vars": st.dictionaries(KEYS, YAML_VALUE, max_size=2)}),
    lambda inner: st.fixed_dictionaries({}, optional={
        "children": st.dictionaries(GROUP_NAME, inner, max_size=2),
        "hosts": st.dictionaries(st.sampled_from(["h1", "h2"]), HOST_VARS, max_size=2)}),
    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(INI_LINE, max_size=12))
def test_any_ini_inventory_loads_or_gives_one_clear_error(lines: list[str]) -> None:
    _load_all("\n".join(lines), "hosts.ini")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(GROUP_NAME, GROUP, min_size=1, max_size=3))
def test_any_ansible_yaml_inventory_loads_or_gives_one_clear_error(
        data: dict[str, Any]) -> None:
    _load_all(yaml.safe_dump(data, allow_unicode=True))


@FAST
@given(st.text(st.sampled_from("ab-"), max_size=3), st.integers(0, 300),
       st.integers(0, 300), st.integers(1, 4), st.booleans(),
       st.text(st.sampled_from("xy.-"), max_size=3))
def test_a_numeric_host_range_is_every_number_in_order_at_its_width(
        prefix: str, a: int, b: int, step: int, padded: bool, suffix: str) -> None:
    first, last = min(a, b), max(a, b)
    width = len(str(last)) + 1 if padded else 0  # a leading zero: every name that wide
    beg, end = (str(first).zfill(width), str(last).zfill(width)) if padded else \
        (str(first), str(last))
    names = expand_range(f"{prefix}[{beg}:{end}:{step}]{suffix}")
    numbers = list(range(first, last + 1, step))
    assert names == [f"{prefix}{str(n).zfill(width)}{suffix}" for n in numbers]
    assert len(set(names)) == len(names)
    assert all("[" not in n and "]" not in n for n in names)


@FAST
@given(st.text(max_size=30))
def test_a_host_range_expands_or_says_why_and_a_plain_name_is_itself(text: str) -> None:
    try:
        names = expand_range(text)
    except ValueError as exc:
        assert str(exc)
        return
    assert 1 <= len(names) <= MAX_RANGE
    if "[" not in text and "]" not in text:
        assert names == [text]


PATTERN = st.lists(st.sampled_from(["gpu", "fleet", "h1", "h2", "h3", "all", "*", "h*",
                                    "~h[12]", "h[1:2]", "nope", "!gpu", "&fleet", "!h3",
                                    "&h*", "!nope", "[", "~("])
                   | st.text(st.sampled_from("abgh123*?-."), max_size=5),
                   max_size=4)


@FAST
@given(PATTERN, st.sampled_from([",", ":"]))
def test_a_hosts_pattern_selects_inventory_hosts_once_or_says_why(
        items: list[str], sep: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "hosts.ini").write_text("[gpu]\nh[1:2]\n[fleet:children]\ngpu\n"
                                             "[other]\nh3\n")
        inv = inventory.load(tmp)
        try:
            chosen = inv.select(sep.join(items))
        except ConfigError as exc:
            assert str(exc)
            return
        assert chosen and len(set(chosen)) == len(chosen)
        assert set(chosen) <= set(inv.hosts)
        for item in items:  # an exclusion always holds
            if item.startswith("!") and item[1:] in inv.groups:
                assert not set(chosen) & set(inv.groups[item[1:]])


@FAST
@given(st.from_regex(NAME, fullmatch=True) | st.text(min_size=1))
def test_a_valid_name_never_leaves_its_directory(name: str) -> None:
    root = Path("/inventory/models")
    if NAME.match(name):
        assert (root / f"{name}.yml").resolve().parent == root
        assert (root / name).resolve().parent == root  # as a directory name too
        assert len(name) <= 100 and "\x00" not in name


# -- known_hosts patterns: a host name is only ever matched, never interpreted ------------

# what a known_hosts name holds: ASCII names, addresses, "[host]:port" (ssh lowercases ASCII)
HOSTNAME = st.text(st.sampled_from("abcxyzABCXYZ0129.-_[]:%"), min_size=1)


@FAST
@given(HOSTNAME, HOSTNAME)
def test_a_known_hosts_pattern_without_wildcards_matches_only_its_own_name(
        name: str, other: str) -> None:
    assume(name.lower() != other.lower())
    assert host_matches(name, name) and host_matches(name.upper(), name)
    assert not host_matches(name, other)
    assert host_matches("*", name) and host_matches(f"{other},*", name)
    assert not host_matches(f"*,!{name}", name)


# -- what a host says, out through the neutraliser and every report writer (issue 21.5-7) ------
# Text biased towards what breaks a terminal, an XML parser, a browser or a pipeline: ANSI/OSC
# sequences (clear, window title, OSC 52 clipboard, OSC 8 link, DCS), 8-bit C1 CSI, NUL,
# lone surrogates, noncharacters, line separators, bidi overrides, ]]>, </script>, markup,
# workflow-command and table syntax, mixed with arbitrary text (surrogates included).

_FRAGMENTS = (
    "\x1b[2J", "\x1b[31;1m", "\x1b]0;owned\x07", "\x1b]52;c;cm0gLXJmIH4=\x07",
    "\x1b]8;;http://evil/\x1b\\x\x1b]8;;\x1b\\", "\x1bP+q544e\x1b\\", "\x9b2J", "\x9d0;t\x9c",
    "\x07", "\x08", "\x00", "\r", "\r\n", "\n", "\t", "\x7f", "\x85", "\u2028", "\u2029",
    "\u202e", "\u200b", "\ufeff", "\ud800", "\udc80", "\udfff", "\ufffe", "\uffff",
    "\U0010ffff", "]]>", "<![CDATA[", "</script>", "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>", "<a href=javascript:alert(1)>", "<!--", "-->", "&", "&amp;",
    "&#x1b;", '"', "'", "<", ">", "|", "\\", "\\|", "`", "::error::", "::add-mask::x",
    "%0A", "%25", ":", ",", "[/INST]", "[link=file:///etc/shadow]x[/link]", "{{ 7*7 }}",
    "日本語", "e\u0301", "\u00a0", " ",
)
HOST_TEXT = st.lists(
    st.sampled_from(_FRAGMENTS)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=6)
    | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    max_size=14).map("".join)
PROPS = settings(max_examples=200, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# What may reach a terminal or a file: printable characters (Zs spaces too), tab, newline.
_UNPRINTABLE = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]"
# XML 1.0's Char production, as a negated class
_NOT_XML = "[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"


def _printable(text: str) -> bool:
    import unicodedata

    return all(c in "\t\n" or c.isprintable() or unicodedata.category(c) == "Zs"
               for c in text)


@PROPS
@given(HOST_TEXT)
def test_the_neutraliser_lets_no_terminal_control_through_and_keeps_the_lines(
        text: str) -> None:
    import re

    from vigil.report import safe_text

    clean = safe_text(text)
    assert _printable(clean), ascii(clean)
    assert not re.search(_UNPRINTABLE, clean) and "\x1b" not in clean and "\x9b" not in clean
    assert safe_text(clean) == clean  # idempotent: a report of a report changes nothing
    clean.encode("utf-8")  # no lone surrogate left
    # the lines are the input's lines: newlines neither added (U+2028, U+0085, a lone CR)
    # nor lost (CRLF is one newline)
    assert clean.count("\n") == text.replace("\r\n", "\n").count("\n")


@PROPS
@given(HOST_TEXT, HOST_TEXT)
def test_log_lines_carry_host_text_cleaned_one_line_per_line(host: str, text: str) -> None:
    import io
    import re

    from vigil.report import Log, safe_text

    out = io.StringIO()
    Log(out)(host, text)
    lines = out.getvalue().split("\n")
    assert lines[-1] == ""
    expected = safe_text(text).split("\n")
    if len(expected) > 1 and expected[-1] == "":
        expected = expected[:-1]
    assert len(lines) - 1 == len(expected)
    for line in lines[:-1]:
        assert re.match(r"\d\d:\d\d:\d\d ", line) and not re.search(_UNPRINTABLE, line)


class _Tags:
    """The start tags and attribute names an HTML page holds (Python's own HTML parser)."""

    def __init__(self, page: str) -> None:
        from html.parser import HTMLParser

        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        tags, attrs = self.tags, self.attrs

        class P(HTMLParser):
            def handle_starttag(self, tag: str, a: list[tuple[str, str | None]]) -> None:
                tags.add(tag)
                attrs.update(name for name, _ in a)

        P(convert_charrefs=True).feed(page)


_OUTCOMES: dict[str, Any] = {}


def _verify_outcome() -> Any:
    """A real crashed start (its state and snapshots), read once."""
    if not _OUTCOMES:
        from tests.doubles import outcome
        from tests.paths import TRACES

        _OUTCOMES["o"] = outcome("lab-kill9-crashed.jsonl")
        _OUTCOMES["snaps"] = replay.load(TRACES / "lab-kill9-crashed.jsonl")[1]
    return _OUTCOMES["o"], _OUTCOMES["snaps"]


def _hostile_outcomes(text: str) -> list[Any]:
    """A lost host and a crashed one whose every host-given string is ``text``."""
    import dataclasses

    from vigil.verify.watch import Outcome

    o, _ = _verify_outcome()
    state = dataclasses.replace(o.state, cause=text, proof=text, summary=text, remedy=text)
    return [Outcome(f"h{text}", error=f"e{text}", exit_code=1),
            dataclasses.replace(o, host=f"c{text}", state=state)]


def _hostile_rollout(text: str) -> Any:
    from vigil.deploy import rollout
    from vigil.report import HostResult

    failed = HostResult(f"h{text}", "failed", error=f"e{text}", verdict="crashed", seconds=1.0)
    ok = HostResult(f"o{text}", "changed", actions=[f"restart: {text}"], seconds=2.0)
    return rollout.Rollout(serial=f"1{text}", budget="0", untouched=[f"u{text}"],
                           batches=[rollout.BatchResult(1, [ok.host, failed.host], [ok, failed])],
                           rolled_back=[HostResult(failed.host, "failed", error=f"r{text}")])


@PROPS
@given(HOST_TEXT)
def test_any_host_text_makes_junit_that_parses_back_to_the_cleaned_text(text: str) -> None:
    import re
    import xml.etree.ElementTree as ET

    from vigil.deploy import rollout
    from vigil.report import safe_text
    from vigil.verify import report as verify_report

    lost, crashed = _hostile_outcomes(text)
    for doc in (verify_report.junit_xml([lost, crashed]),
                rollout.junit_xml(_hostile_rollout(text))):
        assert not re.search(_NOT_XML, doc) and not re.search(_UNPRINTABLE, doc)
        ET.fromstring(doc)  # a CI's parser reads it
    cases = ET.fromstring(verify_report.junit_xml([lost, crashed])).findall(".//testcase")
    assert [c.get("name") for c in cases] == [safe_text(lost.host), safe_text(crashed.host)]
    error, failure = cases[0].find("error"), cases[1].find("failure")
    assert error is not None and error.text == safe_text(f"e{text}")
    assert failure is not None and safe_text(text) in (failure.text or "")
    assert failure.get("message") == safe_text(f"crashed: {text or '-'} — {text}".strip())


@PROPS
@given(HOST_TEXT)
def test_any_host_text_makes_html_pages_without_an_injected_tag_or_a_raw_control(
        text: str) -> None:
    import dataclasses
    import re

    from tests.doubles import rec
    from vigil.deploy import rollout_html
    from vigil.verify import html as verify_html

    _, snaps = _verify_outcome()

    def pages(t: str) -> list[str]:
        starts = [verify_html.start_of(o, snaps) for o in _hostile_outcomes(t)]
        records = [dataclasses.replace(rec(100.0 + i, host=f"h{t}", model=f"m{t}"),
                                       verdict=v, cause=t) for i, v in enumerate(("ready",
                                                                                  "crashed"))]
        return [verify_html.start_page(starts), verify_html.history_page(records),
                rollout_html.rollout_page(_hostile_rollout(t))]

    for page, plain in zip(pages(text), pages("a\nb c"), strict=True):
        assert not re.search(_UNPRINTABLE, page.replace("\n", ""))
        assert "<script" not in page.lower() and "</script" not in page.lower()
        got, want = _Tags(page), _Tags(plain)
        assert got.tags <= want.tags and got.attrs <= want.attrs, (
            got.tags - want.tags, got.attrs - want.attrs)
        page.encode("utf-8")


@PROPS
@given(HOST_TEXT)
def test_any_host_text_makes_json_that_loads_back_exactly_and_prints_no_control(
        text: str) -> None:
    import json

    from vigil.deploy import rollout
    from vigil.report import write_json
    from vigil.verify import report as verify_report

    ro = _hostile_rollout(text)
    with tempfile.TemporaryDirectory() as tmp:
        for name, payload in (("r.json", rollout.rollout_json(ro)),
                              ("v.json", verify_report.run_json(_hostile_outcomes(text), 3))):
            write_json(f"{tmp}/{name}", payload)
            raw = Path(f"{tmp}/{name}").read_bytes()
            assert raw.isascii() and not any(b < 0x20 and b != 0x0A for b in raw)  # cat-safe
            json.loads(raw)
        back = json.loads(Path(f"{tmp}/r.json").read_text())
    # a machine gets the host's own string back (JSON joins a surrogate pair into its one
    # character; a host's undecodable bytes are lone low surrogates, never a pair)
    same = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    assert back["failed"] == [f"h{same}"] and back["untouched"] == [f"u{same}"]


def _unescaped_pipes(row: str) -> int:
    """Cell delimiters of a GitHub-flavoured Markdown table row: a | after an even run of
    backslashes (an odd run escapes it)."""
    import re

    return sum(1 for m in re.finditer(r"(\\*)\|", row) if len(m.group(1)) % 2 == 0)


@PROPS
@given(HOST_TEXT, HOST_TEXT)
def test_any_host_text_makes_one_annotation_per_host_and_a_table_row_of_three_cells(
        host: str, detail: str) -> None:
    import re

    from vigil.tasks import pipeline

    rows = [pipeline.Row(f"h{host}", "crashed", f"d{detail}", True),
            pipeline.Row(f"g{detail}", "ready", host, False)]
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": f"{tmp}/summary.md"}
        with redirect_stdout(io.StringIO()):
            printed = pipeline.report("verify", rows, env)
        table = Path(f"{tmp}/summary.md").read_text(encoding="utf-8")
    # one workflow command, for the one failed host: nothing of the host's text starts
    # another line (::add-mask::, ::set-env::) or ends the title early
    assert "\n" not in printed and not re.search(_UNPRINTABLE, printed)
    title = re.fullmatch(r"::error title=([^:]*)::(.*)", printed)
    assert title is not None and "," not in title.group(1)
    body = table.split("\n")
    assert body[2] == "| host | result | detail |" and len(body) == 4 + len(rows) + 2
    for row in body[4:4 + len(rows)]:
        assert row.startswith("| ") and row.endswith(" |")
        assert _unescaped_pipes(row) == 4, row  # three cells, whatever the text
        assert "<" not in row  # no HTML tag (an <img> pixel, an <a> link) renders there
        assert not re.search(_UNPRINTABLE, row)
