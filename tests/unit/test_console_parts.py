"""The console's pure parts: the graph's layers and marks, "way forward now" for each state of
a step, the list's filters and cursors, chart summaries, redacted excerpts, where a login may
send a person back to."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from onward.automations.document import parse_model
from onward.console import charts, graph, way
from onward.console.pages import _next, excerpt
from onward.console.reads import Cursor, Filters
from onward.demo import demo_document
from onward.errors import InvalidInput
from onward.kinds import registry

NOW = datetime(2026, 3, 29, 9, 0, tzinfo=UTC)


def loop_doc() -> dict:
    return {
        "id": "loop",
        "steps": [
            {"id": "count", "kind": "set", "with": {"values": {"n": "1"}}, "next": "check"},
            {
                "id": "check",
                "kind": "branch",
                "with": {"cases": [{"when": "true", "next": "count"}], "default": "done"},
            },
            {"id": "done", "kind": "set", "with": {"values": {"x": "1"}}},
        ],
    }


def test_the_graph_has_every_transition_and_layers_from_the_start() -> None:
    g = graph.graph_of(parse_model(demo_document()), registry)
    assert ("approved", "send", "steps.approve.approved") in g.edges
    assert ("approved", "not_sent", "default") in g.edges
    assert ("replied", "no_reply", "default") in g.edges
    assert g.layers["morning"] == 0 and g.layers["draft"] == 1
    assert g.layers["send"] > g.layers["approve"]


def test_a_loop_edge_goes_back_up_without_breaking_the_layers() -> None:
    g = graph.graph_of(parse_model(loop_doc()), registry)
    assert g.layers == {"count": 0, "check": 1, "done": 2}
    svg = graph.render_svg(g, path=["count", "check", "count", "check", "done"], current=None)
    assert svg.count('class="edge taken"') == 3  # count→check, check→count, check→done
    assert svg.count('class="node visited') == 3


def test_the_svg_marks_the_current_step_and_escapes_names() -> None:
    g = graph.graph_of(parse_model(demo_document()), registry)
    svg = graph.render_svg(g, path=["morning", "draft"], current="draft", current_status="running")
    assert 'class="node visited current running" data-step="draft"' in svg
    assert 'role="img"' in svg and "<title" in svg
    assert "<script" not in graph.render_svg(g, title="<script>")


def step(status: str, **more: object) -> dict:
    return {
        "seq": 3,
        "step_id": "send",
        "lane": "io",
        "status": status,
        "attempt": 2,
        "owner": "w1",
        "lease_until": NOW + timedelta(seconds=30),
        "available_at": NOW - timedelta(seconds=2),
        "wait_kind": None,
        "error": None,
        **more,
    }


def ways(s: dict, **kw: object) -> list[way.Way]:
    args = {"timers": [], "approvals": [], "correlations": [], "circuits": [], "more": {}}
    args.update(kw)
    run = {"run_id": "r1", "finished_at": None}
    return way.ways_forward(run, [s], now=NOW, **args)  # type: ignore[arg-type]


def test_way_forward_for_each_state_of_the_step() -> None:
    (ready,) = ways(step("ready"))
    assert "lane io claims" in ready.what and ready.when == NOW - timedelta(seconds=2)
    (running,) = ways(step("running"))
    assert "w1 (attempt 2)" in running.what and not running.overdue
    (lapsed,) = ways(step("running", lease_until=NOW - timedelta(seconds=1)))
    assert lapsed.overdue
    timer = {
        "seq": 3,
        "fired_at": None,
        "timer_id": 7,
        "purpose": "deadline",
        "due_at": NOW + timedelta(hours=1),
        "wake_n": 1,
    }
    waiting = ways(
        step("waiting", wait_kind="signal", signals=["reply"]),
        timers=[timer],
        correlations=[{"seq": 3, "key": "msg_1"}],
    )
    assert [w.row.split()[0] for w in waiting] == ["timers", "signals"]
    assert "msg_1" in waiting[1].what
    (none,) = ways(step("waiting", wait_kind="timer"))
    assert none.what.startswith("NONE")
    (review,) = ways(step("parked", wait_kind="review"))
    assert "resolves the review" in review.what
    circuit = {"key": "provider:email", "state": "open", "retry_at": NOW + timedelta(seconds=9)}
    probe, person = ways(
        step("parked", wait_kind="circuit", error={"circuit": "provider:email"}), circuits=[circuit]
    )
    assert probe.when == circuit["retry_at"] and "probe" in probe.what and "person" in person.what
    assert (
        way.ways_forward(
            {"run_id": "r", "finished_at": NOW},
            [],
            timers=[],
            approvals=[],
            correlations=[],
            circuits=[],
            more={},
            now=NOW,
        )
        == []
    )


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"status": "nope"}, "status"),
        ({"version": "0"}, "version"),
        ({"range": "2w"}, "range"),
        ({"since": "soon"}, "since"),
        ({"parked": "review", "status": "failed"}, "parked"),
        ({"contact": "x" * 300}, "contact"),
        ({"automation": "a\x00"}, "automation"),
    ],
)
def test_filters_refuse_what_does_not_fit_naming_the_field(query: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        Filters.parse(query)
    assert str(exc.value).startswith(field)


def test_filters_and_cursors_read_what_a_person_types() -> None:
    f = Filters.parse({"parked": "budget", "automation": " a ", "version": "2", "range": "1h"})
    assert (f.status, f.parked, f.automation_id, f.version) == ("parked", "budget", "a", 2)
    assert f.since is not None and f.until is None
    c = Cursor(NOW, "run_1")
    assert Cursor.parse(c.text(), "before") == c
    with pytest.raises(InvalidInput):
        Cursor.parse("2026-03-29T09:00:00+00:00", "before")


def test_charts_say_in_words_what_they_show() -> None:
    svg = charts.bars([None] * 58 + [2.0, 4.5], label="timer lateness", unit=" s")
    assert 'aria-label="timer lateness: highest 4.50 s, latest 4.50 s' in svg
    assert svg.count('class="bar"') == 2
    assert "no data in the last hour" in charts.bars([None] * 60, label="x")


def test_excerpts_are_bounded_and_star_secrets() -> None:
    text = excerpt({"token": "abc", "nested": [{"api_key": "k"}], "ok": "x" * 1000})
    assert "abc" not in text and '"k"' not in text and len(text) == 300


def test_a_login_sends_back_to_this_site_only() -> None:
    assert _next("/runs/r1?x=1") == "/runs/r1?x=1"
    for away in ("https://evil.test/", "//evil.test", "/\\evil.test", None, "runs"):
        assert _next(away) == "/"
