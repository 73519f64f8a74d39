"""JSON between onward's pools and PostgreSQL (``onward.jsoncodec``): orjson where it keeps
every value as ``json`` would, ``json`` where it would not."""

from __future__ import annotations

import json

from onward import jsoncodec


def test_what_is_written_reads_back_as_json_would_read_it() -> None:
    value = {"x": 1, "s": "é ✓", "f": 1.5, "l": [None, True, {"n": -3}], 2: "int key"}
    assert jsoncodec.loads(jsoncodec.dumps(value)) == json.loads(json.dumps(value))


def test_integers_beyond_64_bits_keep_every_digit_both_ways() -> None:
    big = {"n": 2**70, "m": -(2**64), "id": "12345678901234567890123"}
    assert jsoncodec.loads(jsoncodec.dumps(big)) == big
    assert jsoncodec.loads(b'{"n": 1180591620717411303424}') == {"n": 2**70}
