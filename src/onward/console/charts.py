"""Small server-rendered SVG charts for the health page: one value per minute over the last
hour, as bars, with the largest value labelled. No script and no library: a chart is a
``<svg role="img">`` whose label says in words what it shows, for a screen reader too."""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

W, H, PAD_L, PAD_B, PAD_T = 360, 90, 44, 16, 10


def bars(values: Sequence[float | None], *, label: str, unit: str = "", minutes: int = 60) -> str:
    """``values``: one per minute, oldest first (``None``: nothing happened that minute)."""
    known = [v for v in values if v is not None]
    top = max(known, default=0.0)
    scale = (H - PAD_B - PAD_T) / top if top > 0 else 0.0
    n = max(len(values), 1)
    step = (W - PAD_L) / n
    summary = (
        f"{label}: no data in the last hour"
        if not known
        else f"{label}: highest {_fmt(top)}{unit}, latest {_fmt(known[-1])}{unit}, "
        f"over the last {minutes} minutes"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {W} {H}" width="{W}" height="{H}" aria-label="{escape(summary)}">',
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W}" y2="{H - PAD_B}" class="axis"/>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + 8}" class="tick" text-anchor="end">'
        f"{escape(_fmt(top))}{escape(unit)}</text>",
        f'<text x="{PAD_L - 4}" y="{H - PAD_B}" class="tick" text-anchor="end">0</text>',
        f'<text x="{PAD_L}" y="{H - 2}" class="tick">-{minutes}m</text>',
        f'<text x="{W}" y="{H - 2}" class="tick" text-anchor="end">now</text>',
    ]
    for i, v in enumerate(values):
        if not v:
            continue
        h = max(1.0, v * scale)
        parts.append(
            f'<rect x="{PAD_L + i * step + 0.5:.1f}" y="{H - PAD_B - h:.1f}" '
            f'width="{max(step - 1, 1):.1f}" height="{h:.1f}" class="bar"/>'
        )
    if not known:
        parts.append(
            f'<text x="{(W + PAD_L) / 2}" y="{H / 2}" class="empty" text-anchor="middle">'
            "no data in the last hour</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"
