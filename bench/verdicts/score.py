"""Score `replay` on CASES.tsv files: verdict, cause and phase, by cause and by vLLM version.

    .venv/bin/python bench/verdicts/score.py tests/fixtures/real-logs/CASES.tsv [...] [--cases]

Same columns and rules as shared/tools/score_replays.py (undecided = no final verdict;
cause `-` = none), run in-process. Prints markdown tables (RESULTS.md takes them as is).
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

from vigil.errors import VigilError
from vigil.verify.replay import replay_file


def _version(raw: str) -> str:
    m = re.search(r"(\d+)\.(\d+)", raw)
    return f"{m.group(1)}.{m.group(2)}" if m else "?"


def score(tsv: Path) -> list[dict[str, object]]:
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    out: list[dict[str, object]] = []
    for r in rows:
        try:
            d = replay_file(tsv.parent / r["file"])
            gv, gc, gp = d.get("verdict") or "undecided", d.get("cause"), d.get("phase")
        except VigilError as exc:
            gv, gc, gp = f"error: {exc}", None, None
        ec, ep = r["expected_cause"], r["last_phase"]
        out.append({
            "file": r["file"], "ev": r["expected_verdict"], "ec": ec, "ep": ep,
            "gv": gv, "gc": gc, "gp": gp, "version": _version(r["vllm_version"]),
            "v_ok": gv == r["expected_verdict"],
            "c_ok": (gc is None) if ec == "-" else gc == ec,
            "p_ok": None if ep == "-" else gp == ep,
        })
    return out


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f} %)" if d else "-"


def table(results: list[dict[str, object]], key: str) -> str:
    groups: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in results:
        groups[str(r[key])].append(r)
    lines = [f"| {key} | n | verdict | cause | both | phase |", "|---|---|---|---|---|---|"]
    for name in sorted(groups):
        g = groups[name]
        ph = [r for r in g if r["p_ok"] is not None]
        lines.append(
            f"| {name} | {len(g)} | {_pct(sum(bool(r['v_ok']) for r in g), len(g))} | "
            f"{_pct(sum(bool(r['c_ok']) for r in g), len(g))} | "
            f"{_pct(sum(bool(r['v_ok'] and r['c_ok']) for r in g), len(g))} | "
            f"{_pct(sum(bool(r['p_ok']) for r in ph), len(ph))} |")
    return "\n".join(lines)


def summary(results: list[dict[str, object]]) -> str:
    n = len(results)
    ph = [r for r in results if r["p_ok"] is not None]
    return (f"verdict {_pct(sum(bool(r['v_ok']) for r in results), n)}, "
            f"cause {_pct(sum(bool(r['c_ok']) for r in results), n)}, "
            f"both {_pct(sum(bool(r['v_ok'] and r['c_ok']) for r in results), n)}, "
            f"phase {_pct(sum(bool(r['p_ok']) for r in ph), len(ph))}")


def main(argv: list[str]) -> int:
    show_cases = "--cases" in argv
    for arg in [a for a in argv if not a.startswith("--")]:
        res = score(Path(arg))
        print(f"## {arg}\n\n{summary(res)}\n")
        print(table(res, "ec") + "\n")
        print(table(res, "version") + "\n")
        wrong = [r for r in res if not (r["v_ok"] and r["c_ok"] and r["p_ok"] is not False)]
        for r in wrong if show_cases else []:
            print(f"- {r['file']}: expected {r['ev']}/{r['ec']}/{r['ep']}, "
                  f"got {r['gv']}/{r['gc']}/{r['gp']}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
