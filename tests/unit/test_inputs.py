"""onward.inputs: what PostgreSQL's jsonb cannot hold is refused before anything is stored,
with the problem and where it is. The round trip of what is accepted is checked against a real
PostgreSQL in tests/integration/test_hostile_input.py."""

from __future__ import annotations

import datetime

import pytest

from onward.errors import InvalidInput
from onward.inputs import MAX_DEPTH, check_storable, check_text, parse_json

REFUSED = [
    pytest.param(b"[" * 50_000 + b"]" * 50_000, "nested deeper than 64 levels", id="deep-50k"),
    pytest.param("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper", id="deep-65"),
    pytest.param('{"a": {"b": [1, 2, 3, "x\\u0000"]}}', "$.a.b[3]: \\u0000 (NUL)", id="nul"),
    pytest.param('{"a\\u0000": 1}', '$["a\\u0000"]: \\u0000 (NUL)', id="nul-key"),
    pytest.param('{"a": "\\ud800"}', "$.a: a lone surrogate (\\ud800)", id="surrogate"),
    pytest.param('"\ud800"', "$: a lone surrogate", id="raw-surrogate"),
    pytest.param("[1, NaN]", "$[1]: NaN is not a number", id="nan"),
    pytest.param('{"x": -Infinity}', "$.x: -Infinity", id="-inf"),
    pytest.param('{"x": 1e400}', "$.x: 1e400 is not a number", id="1e400"),
    pytest.param("9" * 5000, "more than 4300 digits", id="huge-int"),
    pytest.param(b'{"a": "\xff"}', "not UTF-8 (invalid byte at offset 7)", id="not-utf8"),
    pytest.param(b'{"a": ', "not valid JSON", id="truncated"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_parse_json_refuses_what_jsonb_cannot_hold(text: str | bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_json(text, "the body")
    assert str(caught.value).startswith("the body: ")
    assert message in str(caught.value)


def test_parse_json_accepts_the_limits_themselves() -> None:
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_json(nested, "x") is not None
    assert parse_json('{"a": "\\ud83d\\ude00", "b": 1e308}', "x") == {"a": "😀", "b": 1e308}
    assert parse_json("\ufeff[1]".encode(), "x") == [1]
    assert parse_json("9" * 4300, "x") == int("9" * 4300)


def test_check_storable_refuses_values_that_are_not_json() -> None:
    with pytest.raises(InvalidInput, match=r"\$\.when: a date is not JSON"):
        check_storable({"when": datetime.date(2026, 1, 1)}, "the payload")
    with pytest.raises(InvalidInput, match=r"\$\.a\[1\]: nan is not a number"):
        check_storable({"a": [1, float("nan")]}, "the payload")
    with pytest.raises(InvalidInput, match="an object key must be a string"):
        check_storable({1: "a"}, "the payload")
    cycle: dict = {}
    cycle["self"] = cycle
    with pytest.raises(InvalidInput, match="nested deeper than 64 levels"):
        check_storable(cycle, "the payload")
    # loose: other leaves (and non-finite floats) are the caller's business, strings are not
    check_storable({1: datetime.date(2026, 1, 1), "d": float("inf")}, "doc", loose=True)
    with pytest.raises(InvalidInput, match="NUL"):
        check_storable({1: "\x00"}, "doc", loose=True)


def test_a_shared_node_counts_each_time_and_the_walk_stops_early() -> None:
    bomb: list = ["x" * 10] * 10
    for _ in range(60):  # 2**60 leaves once expanded, a few hundred objects in memory
        bomb = [bomb, bomb]
    with pytest.raises(InvalidInput, match="larger than 100000 bytes once expanded"):
        check_storable(bomb, "the document", max_bytes=100_000)


def test_check_text() -> None:
    assert check_text("evt_1", "X-Event-Id") == "evt_1"
    with pytest.raises(InvalidInput, match=r"X-Event-Id: .*NUL"):
        check_text("a\x00b", "X-Event-Id")
    with pytest.raises(InvalidInput, match="lone surrogate"):
        check_text("a\udfffb", "automation id")


def test_a_start_payload_is_measured_as_utf8_json_and_keeps_every_digit() -> None:
    # start.prepare: the payload's JSON in UTF-8 as PostgreSQL holds it (orjson), json for what
    # orjson refuses (an integer beyond 64 bits), each measured against the limit
    import json

    from onward.errors import PayloadTooLarge
    from onward.start import prepare

    p = prepare("greet", {"name": "Zoë", "n": 2**70, "xs": (1, 2.5, None, True)}, event_id="e1")
    assert json.loads(p.text) == {"name": "Zoë", "n": 2**70, "xs": [1, 2.5, None, True]}
    assert "Zoë" in p.text and p.start_key == "greet:e1"
    text = prepare("greet", {"s": "é" * 10}, max_payload_bytes=28).text
    assert len(text.encode()) == 28  # {"s":""}: 8 bytes, and ten of two
    with pytest.raises(PayloadTooLarge):
        prepare("greet", {"s": "é" * 10}, max_payload_bytes=27)
    with pytest.raises(InvalidInput, match=r"\$\.a\[1\]: nan is not a number"):
        prepare("greet", {"a": [1, float("nan")]})
