"""The picture of a rollout (pure): hosts x time, one row per host, batches as bands.

Each host's row spans its deploy (grey: lock, facts, plan, apply) with the phases verify
saw on top in the same colours as `invoke verify --html`, and ends in its verdict's
colour; untouched hosts stay empty, rollbacks follow the stopping batch.
"""

from __future__ import annotations

import html
from typing import Any

from vigil.deploy.rollout import Rollout
from vigil.report import HostResult, HostStatus, safe_text, write_text
from vigil.verify import html as verify_html

WIDTH = verify_html.WIDTH
LABEL_W = verify_html.LABEL_W
ROW_H = verify_html.ROW_H
STATUS_COLOUR: dict[str, str] = {
    HostStatus.OK: "#1a7f37", HostStatus.CHANGED: "#1a7f37", HostStatus.FAILED: "#cf222e",
    HostStatus.ROLLED_BACK: "#9a6700", HostStatus.SKIPPED: "#57606a"}


def _e(text: object) -> str:
    # control characters (U+2028, ESC, NUL, a lone surrogate) are shown, not written
    return html.escape(safe_text(str(text)), quote=True)


def _bar(r: HostResult, start: float, epoch: float, scale: float, y: float) -> str:
    x0 = LABEL_W + start * scale
    w = max(1.0, r.seconds * scale)
    out = [f'<rect x="{x0:.1f}" y="{y + 4}" width="{w:.1f}" height="{ROW_H - 8}" '
           f'fill="#d0d7de"><title>{_e(r.host)}: {r.status} in {r.seconds:.1f} s</title></rect>']
    phases: list[dict[str, Any]] = list((r.verify or {}).get("phases") or [])
    for p in phases:
        if not isinstance(p, dict) or p.get("start") is None:
            continue
        px = LABEL_W + (float(p["start"]) - epoch) * scale
        pw = max(1.0, float(p.get("duration_s") or 0) * scale)
        out.append(f'<rect x="{px:.1f}" y="{y + 4}" width="{pw:.1f}" height="{ROW_H - 8}" '
                   f'fill="{verify_html._colour(str(p["name"]))}"><title>{_e(p["name"])} '
                   f'{float(p.get("duration_s") or 0):.1f} s</title></rect>')
    colour = STATUS_COLOUR.get(r.status, "#57606a")
    out.append(f'<rect x="{x0 + w - 3:.1f}" y="{y + 2}" width="4" height="{ROW_H - 4}" '
               f'fill="{colour}"><title>{_e(r.status)}</title></rect>')
    return "".join(out)


def rollout_svg(ro: Rollout) -> str:
    rows: list[tuple[str, str]] = []  # (label, svg of the row body)
    span = max(ro.seconds, 1.0)
    scale = WIDTH / span
    bands: list[str] = []
    y = 0.0
    for b in ro.batches:
        top = y
        for r in b.results:
            rows.append((r.host, _bar(r, b.offset_s, ro.started_at, scale, y)))
            y += ROW_H
        shade = "#f6f8fa" if b.index % 2 else "#ffffff"
        bands.append(f'<rect x="0" y="{top}" width="{LABEL_W + WIDTH}" height="{y - top}" '
                     f'fill="{shade}"/><text x="4" y="{top + 14}" fill="#57606a">'
                     f'batch {b.index}</text>')
        x = LABEL_W + b.offset_s * scale
        bands.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{{H}}" stroke="#8c959f" '
                     'stroke-dasharray="3,3"/>')
    for h in ro.untouched:
        rows.append((h, f'<text x="{LABEL_W + 4}" y="{y + 15}" fill="#57606a">untouched'
                        '</text>'))
        y += ROW_H
    at = ro.rollback_offset_s
    for r in ro.rolled_back:
        rows.append((f"{r.host} (rollback)", _bar(r, at, ro.started_at, scale, y)))
        at += r.seconds
        y += ROW_H
    height = y + 20
    body = [b.replace("{H}", f"{height:.0f}") for b in bands]
    for i, (label, row) in enumerate(rows):
        body.append(f'<text x="70" y="{i * ROW_H + 15}">{_e(label)}</text>{row}')
    for k in range(0, int(span) + 1, max(10, int(span / 8) // 10 * 10 or 10)):
        x = LABEL_W + k * scale
        body.append(f'<text x="{x:.1f}" y="{height - 4}" fill="#57606a">{k} s</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + WIDTH + 20}" '
            f'height="{height:.0f}">{"".join(body)}</svg>')


def rollout_page(ro: Rollout) -> str:
    head = (f'<p class="muted">serial {_e(ro.serial)}, max-fail {_e(ro.budget)}: '
            f"done {len(ro.done)}, failed {len(ro.failed)}, untouched {len(ro.untouched)}"
            f"{', stopped past the failure budget' if ro.stopped else ''}; "
            f"{ro.seconds:.0f} s</p>")
    return verify_html._page("vigil rollout", head + rollout_svg(ro))


def write_html(path: str, ro: Rollout) -> None:
    write_text(path, rollout_page(ro))
