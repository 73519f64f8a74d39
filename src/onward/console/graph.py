"""An automation's graph as server-rendered SVG: steps in layers from the start, transitions as
arrows, and -- for a run -- the path it took and where it is now.

Edges come from each step kind's own ``successors`` (the same the publisher checks), so a
branch's cases and default are arrows like ``next``. Layers are the longest path from the
start over forward edges (a loop's edge back up is drawn on the side); within a layer, steps
keep their order in the document. No JavaScript, no layout library: a few dozen steps is what
a person draws.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

from onward.automations.document import AutomationDoc
from onward.kinds import Registry

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 38, 24, 34, 14


@dataclass
class Graph:
    order: list[str]
    kinds: dict[str, str]
    edges: list[tuple[str, str, str]]  # (from, to, label)
    start: str
    layers: dict[str, int] = field(default_factory=dict)


def graph_of(doc: AutomationDoc, registry: Registry) -> Graph:
    edges: list[tuple[str, str, str]] = []
    for step in doc.steps:
        targets = _successors(step, registry)
        labels = _branch_labels(step.params)
        for target in dict.fromkeys(targets):
            edges.append((step.id, target, labels.get(target, "")))
    graph = Graph(
        order=[s.id for s in doc.steps],
        kinds={s.id: s.kind for s in doc.steps},
        edges=[e for e in edges if e[1] in {s.id for s in doc.steps}],
        start=doc.start_step,
    )
    graph.layers = _layers(graph)
    return graph


def _successors(step: Any, registry: Registry) -> list[str]:
    spec = registry.get(step.kind)
    if spec is None:
        return [step.next] if step.next else []
    try:
        return list(spec.successors(step, spec.parse_params(step.params)))
    except Exception:  # a version published under older rules: fall back to next
        return [step.next] if step.next else []


def _branch_labels(params: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for case in params.get("cases") or []:
        if isinstance(case, dict) and isinstance(case.get("next"), str):
            when = str(case.get("when", ""))
            labels.setdefault(case["next"], when if len(when) <= 22 else when[:21] + "…")
    if isinstance(params.get("default"), str):
        labels.setdefault(params["default"], "default")
    return labels


def _layers(graph: Graph) -> dict[str, int]:
    """Longest distance from the start over edges that do not close a loop (found by a depth
    first search from the start); steps no path reaches go below the rest."""
    out: dict[str, list[str]] = {s: [] for s in graph.order}
    for a, b, _ in graph.edges:
        out[a].append(b)
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}

    def visit(node: str) -> None:
        stack = [(node, iter(out[node]))]
        state[node] = 1
        while stack:
            current, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[current] = 2
                stack.pop()
            elif state.get(child) == 1:
                back.add((current, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(out[child])))

    if graph.start in out:
        visit(graph.start)
    layer = {graph.start: 0} if graph.start in out else {}
    for _ in range(len(graph.order)):  # relax: a DAG settles in at most n passes
        changed = False
        for a, b, _ in graph.edges:
            if (a, b) in back or a not in layer:
                continue
            if layer.get(b, -1) < layer[a] + 1:
                layer[b] = layer[a] + 1
                changed = True
        if not changed:
            break
    bottom = max(layer.values(), default=-1) + 1
    for step in graph.order:
        layer.setdefault(step, bottom)
    return layer


def path_of(steps: list[dict[str, Any]]) -> list[str]:
    """The step ids a run went through, in order (its step rows by position)."""
    return [s["step_id"] for s in sorted(steps, key=lambda s: s["seq"])]


def render_svg(
    graph: Graph,
    *,
    path: list[str] | None = None,
    current: str | None = None,
    current_status: str | None = None,
    title: str = "automation graph",
) -> str:
    """The graph as an inline ``<svg>``; with ``path`` (a run's steps in order) the steps and
    transitions it took are marked, and ``current`` is where it is now."""
    path = path or []
    visited = set(path)
    taken = set(itertools.pairwise(path))
    rows: dict[int, list[str]] = {}
    for step in graph.order:
        rows.setdefault(graph.layers[step], []).append(step)
    width = max(len(r) for r in rows.values()) * (BOX_W + GAP_X) - GAP_X + 2 * PAD + 60
    height = len(rows) * (BOX_H + GAP_Y) - GAP_Y + 2 * PAD
    pos: dict[str, tuple[float, float]] = {}
    for depth, names in rows.items():
        row_w = len(names) * (BOX_W + GAP_X) - GAP_X
        x0 = (width - 60 - row_w) / 2
        for i, name in enumerate(names):
            pos[name] = (x0 + i * (BOX_W + GAP_X), PAD + depth * (BOX_H + GAP_Y))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" role="img" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
        f'aria-labelledby="graph-title">',
        f'<title id="graph-title">{escape(title)}</title>',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'class="arrowhead"/></marker>'
        '<marker id="arrow-taken" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'class="arrowhead taken"/></marker></defs>',
    ]
    for a, b, label in graph.edges:
        parts.append(_edge(pos[a], pos[b], label, (a, b) in taken, width))
    for name in graph.order:
        x, y = pos[name]
        cls = "node"
        if name in visited:
            cls += " visited"
        if name == current:
            cls += f" current {current_status or ''}".rstrip()
        if name == graph.start:
            cls += " start"
        parts.append(
            f'<g class="{cls}" data-step="{escape(name)}"><rect x="{x:.0f}" y="{y:.0f}" '
            f'width="{BOX_W}" height="{BOX_H}" rx="6"/>'
            f'<text x="{x + BOX_W / 2:.0f}" y="{y + 16:.0f}" class="id">{escape(name[:20])}</text>'
            f'<text x="{x + BOX_W / 2:.0f}" y="{y + 31:.0f}" class="kind">'
            f"{escape(graph.kinds[name][:24])}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _edge(
    a: tuple[float, float], b: tuple[float, float], label: str, taken: bool, width: float
) -> str:
    cls = "edge taken" if taken else "edge"
    marker = "url(#arrow-taken)" if taken else "url(#arrow)"
    ax, ay = a[0] + BOX_W / 2, a[1] + BOX_H
    bx, by = b[0] + BOX_W / 2, b[1]
    if by <= a[1]:  # a loop back up: around the right side
        rx = width - 30
        d = (
            f"M{a[0] + BOX_W:.0f},{a[1] + BOX_H / 2:.0f} C{rx:.0f},{a[1] + BOX_H / 2:.0f} "
            f"{rx:.0f},{b[1] + BOX_H / 2:.0f} {b[0] + BOX_W:.0f},{b[1] + BOX_H / 2:.0f}"
        )
        lx, ly = rx - 4, (a[1] + b[1]) / 2 + BOX_H / 2
    else:
        mid = (ay + by) / 2
        d = f"M{ax:.0f},{ay:.0f} C{ax:.0f},{mid:.0f} {bx:.0f},{mid:.0f} {bx:.0f},{by:.0f}"
        lx, ly = bx + 6, by - 5  # beside the arrowhead: labels of one source never meet
    text = f'<text x="{lx:.0f}" y="{ly:.0f}" class="label">{escape(label)}</text>' if label else ""
    return f'<path d="{d}" class="{cls}" marker-end="{marker}"/>{text}'
