"""JSON between onward's pools and PostgreSQL, with orjson: about a tenth of the standard
library's time to write and read a step's output, variables and wakes (``json`` took 8% of a
worker's CPU here). Whatever orjson refuses and ``json`` takes (an integer beyond 64 bits)
falls back to ``json``, and so does reading one, so nothing that was stored before is refused now. The pools of
``onward.db.make_pool`` copy these adapters; psycopg's global ones are left as they are, so a
program that embeds onward keeps its own."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.json import set_json_dumps, set_json_loads

_OPTIONS = orjson.OPT_NON_STR_KEYS
_LONG_NUMBER = re.compile(rb"\d{20}")


def dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj).encode()


def loads(data: bytes | str) -> Any:
    # orjson reads an integer beyond 64 bits as a float: twenty digits in a row (in a number
    # or, harmlessly, in a string) go to json, which keeps every digit
    if _LONG_NUMBER.search(data if isinstance(data, bytes) else data.encode()):
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


ADAPTERS = AdaptersMap(psycopg.adapters)
set_json_dumps(dumps, ADAPTERS)
set_json_loads(loads, ADAPTERS)
