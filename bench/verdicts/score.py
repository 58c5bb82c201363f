"""Score `replay` on CASES.tsv files: verdict, cause and phase, by cause and by vLLM version.

    .venv/bin/python bench/verdicts/score.py tests/fixtures/real-logs/CASES.tsv [...] [--cases]
    .venv/bin/python bench/verdicts/score.py --tables [TSV ...]

Same columns and rules as shared/tools/score_replays.py (undecided = no final verdict;
cause `-` = none), run in-process. Prints markdown tables (RESULTS.md takes them as is).
`--tables` pools the files given (default: every corpus under tests/fixtures/real-logs*/,
each log once) into a platform x vLLM version table and a confusion table of causes. The
platform is read from the label (the vllm_version column, the file name, the reason):
the TSVs have no platform column.
"""

from __future__ import annotations

import csv
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from vigil.errors import VigilError
from vigil.verify.replay import replay_file


def _version(raw: str) -> str:
    # "~0.2x" is a 0.2x release (0.20-0.29), not 0.2
    m = re.search(r"(\d+)\.(\d+)(x\b)?", raw)
    return f"{m.group(1)}.{m.group(2)}{m.group(3) or ''}" if m else "?"


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
            "platform": _platform(r),
            "gv": gv, "gc": gc, "gp": gp, "version": _version(r["vllm_version"]),
            "v_ok": gv == r["expected_verdict"],
            "c_ok": (gc is None) if ec == "-" else gc == ec,
            "p_ok": None if ep == "-" else gp == ep,
        })
    return out


# First match wins; the label's version column and file name before its reason (a reason
# may name another platform: "unlike CUDA"). Blackwell is its own row (issue 24.2), first:
# its parts are named exactly, and a port's issue tracker may hold a CUDA user's log.
_PLATFORMS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
        ("CUDA Blackwell", r"sm_?1[02]\d|blackwell|rtx (?:pro )?[56]0\d0|rtx 50|\b5090|\bgb10\b"
                           r"|\bb200\b|\bgb200\b|\bthor\b|dgx spark|sm12x"),
        ("Ascend NPU", r"ascend|\bnpu\b"),
        # not "a GPU seen as a TPU" (gpustack#5509)
        ("TPU (XLA)", r"(?<!as-)(?<!as )(?<!as a )\btpu|\bxla\b|ironwood"),
        ("Kunlun XPU", r"kunlun"),
        ("Intel XPU", r"\bxpu\b|llm-scaler|level.zero|\barc (?:pro|a\d)"),
        ("Gaudi (HPU)", r"gaudi|\bhpu\b|habana"),
        ("AWS Neuron", r"neuron|inferentia|trainium"),
        ("ROCm", r"rocm|\bhip\b|gfx\d|\bmi\d{2,3}\b|radeon|ryzen|strix|\br9700\b|\bamd\b"),
        ("Apple (metal)", r"vllm-metal|\bmps\b|apple"),
        ("CPU build", r"\bcpu build|\bcpu backend|\d \bcpu\b|\(cpu"),
    ))
_BUCKETS = ("≤0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "0.10", "0.11", "0.12-0.19", "≥0.20",
            "?")


def _platform(row: dict[str, str]) -> str:
    for text in (f"{row['vllm_version']} {row['file']}", row.get("reason", "")):
        for name, pattern in _PLATFORMS:
            if pattern.search(text):
                return name
    return "CUDA"


def _bucket(version: str) -> str:
    m = re.fullmatch(r"(\d+)\.(\d+)(x?)", version)
    if m is None:
        return "?"
    major, minor = int(m.group(1)), int(m.group(2))
    if m.group(3):  # "0.2x": the twenties; "0.1x" could be 0.10 or 0.19
        return "≥0.20" if minor >= 2 else "?"
    if major > 0 or minor >= 20:
        return "≥0.20"
    if minor <= 4:
        return "≤0.4"
    return f"0.{minor}" if minor <= 11 else "0.12-0.19"


def _right(r: dict[str, object]) -> bool:
    return bool(r["v_ok"] and r["c_ok"])


def platform_table(results: list[dict[str, object]]) -> str:
    """Platform x vLLM version: right (verdict and cause) / cases in each cell."""
    cells: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in results:
        cells[(str(r["platform"]), _bucket(str(r["version"])))].append(_right(r))
    platforms = sorted({p for p, _ in cells}, key=lambda p: (p != "CUDA", p))
    cols = [b for b in _BUCKETS if any((p, b) in cells for p in platforms)]
    lines = ["| platform | " + " | ".join(cols) + " | all |",
             "|---|" + "---|" * (len(cols) + 1)]
    for p in platforms:
        row = [f"{sum(cells[(p, b)])}/{len(cells[(p, b)])}" if (p, b) in cells else ""
               for b in cols]
        everything = [ok for (q, _), oks in cells.items() if q == p for ok in oks]
        lines.append(f"| {p} | " + " | ".join(row)
                     + f" | {_pct(sum(everything), len(everything))} |")
    totals = [[ok for (_, b2), oks in cells.items() if b2 == b for ok in oks] for b in cols]
    every = [_right(r) for r in results]
    lines.append("| all | " + " | ".join(f"{sum(t)}/{len(t)}" for t in totals)
                 + f" | {_pct(sum(every), len(every))} |")
    return "\n".join(lines)


def _got(r: dict[str, object]) -> str:
    cause = r["gc"] or "-"
    return f"{cause}" if r["v_ok"] else f"{r['gv']}/{cause}"


def confusion_table(results: list[dict[str, object]]) -> str:
    """Expected cause → what vigil said: cases, right, and every other answer with its count
    (`verdict/cause` where the verdict is wrong too; `-` is no cause)."""
    groups: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in results:
        groups[str(r["ec"])].append(r)
    lines = ["| expected cause | cases | right | got instead |", "|---|---|---|---|"]
    for ec in sorted(groups, key=lambda c: (-len(groups[c]), c)):
        g = groups[ec]
        wrong = Counter(_got(r) for r in g if not _right(r))
        instead = ", ".join(f"{got} ({n})" for got, n in wrong.most_common())
        lines.append(f"| {ec} | {len(g)} | {sum(_right(r) for r in g)} | {instead or '—'} |")
    return "\n".join(lines)


def _pooled(tsvs: list[Path]) -> list[dict[str, object]]:
    """Every log of these corpora once (a log listed in two TSVs counts once)."""
    seen: set[Path] = set()
    out: list[dict[str, object]] = []
    for tsv in tsvs:
        for r in score(tsv):
            path = (tsv.parent / str(r["file"])).resolve()
            if path not in seen:
                seen.add(path)
                out.append(r)
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
    files = [a for a in argv if not a.startswith("--")]
    if "--tables" in argv:
        root = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
        tsvs = [Path(a) for a in files] or sorted(root.glob("real-logs*/*.tsv"))
        res = _pooled(tsvs)
        print(f"## All corpora ({len(tsvs)} files, {len(res)} logs)\n\n{summary(res)}\n")
        print("Platform x vLLM version (right = verdict and cause / cases):\n")
        print(platform_table(res) + "\n")
        print("Causes, expected → got:\n")
        print(confusion_table(res))
        return 0
    for arg in files:
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
