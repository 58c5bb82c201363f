"""Invoke tasks of verification: ``verify``, ``history``, ``replay``. Each parses its
flags, makes one library call and reports."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from invoke.context import Context

from vigil.errors import ConfigError
from vigil.report import echo
from vigil.tasks import pipeline
from vigil.tasks.common import (
    HOSTS_HELP,
    SET_HELP,
    JsonFlag,
    emit_json,
    exit_with,
    json_help,
    load_inventory,
    out_path,
    setting,
    template_dirs,
    text_stream,
    user_errors,
    vigil_task,
    watch_settings,
)


@vigil_task(
    help={
        "hosts": HOSTS_HELP,
        "model": "model profile; default: the host's `model`",
        "stack": "runtime stack; default: the host's `stack` (as deploy)",
        "set": SET_HELP + " (as deploy: verify what was deployed)",
        "json": json_help("verdicts, phases, budgets, evidence and smoke"),
        "junit": "write a JUnit XML report (one test case per host) to this file",
        "html": "write one self-contained HTML page (phases, evidence, verdict) to this file",
        "poll": "seconds between polls (default: vigil.poll_s, else each host's poll_s, 5)",
        "probe": "stream (default: one persistent channel, a snapshot per event and per "
                 "second) or poll (one round trip per --poll seconds); vigil.probe sets it",
        "stall": "override every phase's stall window, in seconds",
    },
    iterable=["set_"],
)
def verify(
    c: Context,
    hosts: str = "all",
    model: str | None = None,
    stack: str | None = None,
    set_: list[str] | None = None,
    json: JsonFlag = None,
    junit: str | None = None,
    html: str | None = None,
    poll: float | None = None,
    stall: float | None = None,
    probe: str | None = None,
) -> None:
    """Watch each host's vLLM start phase by phase: ready, crashed, stalled, timed out or
    stopped (a slow start that progresses is given its time)."""
    from vigil.desired import targets as targets_mod
    from vigil.desired.render import SMOKE_SECRETS
    from vigil.verify import html as verify_html
    from vigil.verify import report as verify_report
    from vigil.verify import watch

    with user_errors():
        settings = watch_settings(c, poll, stall, probe)
        # verify writes nothing: of secret_env it needs only the key its smoke sends
        targets = targets_mod.resolve(load_inventory(c), hosts, model=model, stack=stack,
                                     sets=set_ or [], template_dir=template_dirs(c),
                                     require_secrets=SMOKE_SECRETS)
        out = text_stream(json)
        with verify_report.Reporter(out) as rep:
            outcomes = watch.verify_all(targets, settings, setting(c, "state_dir"),
                                        on_poll=rep.poll, on_note=rep.note,
                                        on_predict=rep.predicted)
        code = watch.worst_exit(outcomes)
        echo(verify_report.summary(outcomes), file=out)
        pipeline.report("verify", pipeline.verify_rows(outcomes), stream=out)
        emit_json(c, json, verify_report.run_json(outcomes, code))
        if junit:
            verify_report.write_junit(str(out_path(c, junit)), outcomes)
        if html:
            verify_html.write(str(out_path(c, html)), verify_html.outcomes_page(outcomes))
    exit_with([code])


@vigil_task(help={"model": "only this model profile",
                  "hosts": HOSTS_HELP + " (default: every host)",
                  "html": "also write phase durations over past starts (cold vs warm) as "
                  "one self-contained HTML page to this file",
                  "json": json_help("the past starts (key, verdict, phase durations)")})
def history(c: Context, model: str | None = None, hosts: str | None = None,
            html: str | None = None, json: JsonFlag = None) -> None:
    """Past starts from the local mirror: phase durations, verdicts, cold/warm."""
    from vigil.desired.yamlfile import did_you_mean
    from vigil.verify import history as history_mod
    from vigil.verify import html as verify_html
    from vigil.verify import report as verify_report

    with user_errors():
        inv = load_inventory(c) if hosts or model else None
        names = inv.select(hosts) if inv is not None and hosts else None
        mirror = history_mod.Mirror(setting(c, "state_dir") / "history.sqlite")
        records = mirror.records(model=model, hosts=names)
        if inv is not None and model and not records:
            known = inv.names("models")
            if model not in known:  # a typo, not a model with no starts yet
                raise ConfigError(f"--model {model}: no such profile and no past start of "
                                  f"it{did_you_mean(model, set(known))}", key="--model",
                                  fix=f"use one of: {', '.join(known) or '(none)'}")
            echo(f"no past start of {model} recorded yet", file=sys.stderr)
        for line in mirror.warnings:  # rows an older vigil merged, each ignored
            echo(f"warning: {line}", file=sys.stderr)
        echo(verify_report.history_table(records), file=text_stream(json))
        if html:
            verify_html.write(str(out_path(c, html)), verify_html.history_page(records))
        emit_json(c, json, {"ok": True, "exit_code": 0,
                            "records": [r.to_dict() for r in records]})


@vigil_task(help={
    "json": json_help("the phases and verdict") + " (`replay FILE --json`: put FILE first)",
    "html": "write the picture of the start (phases, evidence, verdict) as one "
            "self-contained HTML page to this file",
}, positional=["file"], inventory=False)
def replay(c: Context, file: str, json: JsonFlag = None, html: str | None = None) -> None:
    """Re-run the watcher on a recorded trace or a vLLM log: phases and verdict; exits
    with the verdict's code as verify does (crashed 3, stalled 4, ...)."""
    from vigil.verify import html as verify_html
    from vigil.verify import replay as replay_mod

    with user_errors():
        got = replay_mod.replay_run(file, keep=bool(html))
        out = got.report
        for line in out["ignored"]:  # what the input held that cannot be replayed
            echo(f"warning: {line}", file=sys.stderr)
        if html:
            verify_html.write(str(out_path(c, html)), verify_html.start_page(
                [verify_html.Start(host=Path(file).name, snapshots=got.snapshots,
                                   state=got.state)], title=f"vigil replay {file}"))
        _replay_text(out, text_stream(json))
        emit_json(c, json, out)
    exit_with([out["exit_code"]])


def _replay_text(out: dict[str, Any], stream: TextIO) -> None:
    from vigil.verify import attempts as attempts_mod

    for ph in out["phases"]:
        echo(f"{ph['name']:<18} {ph['duration_s']:>9.1f} s", file=stream)
    line = f"verdict: {out['verdict'] or 'none'}"
    if out.get("cause"):
        line += f" ({out['cause']})"
    echo(line, file=stream)
    for key in ("proof", "remedy", "evidence", "note"):
        if out.get(key):
            echo(f"{key}: {out[key]}", file=stream)
    earlier = attempts_mod.summary_line(out)
    if earlier:
        echo(earlier, file=stream)
    if out.get("compile_cache"):
        echo(out["compile_cache"]["line"], file=stream)
