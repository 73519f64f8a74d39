"""Input that onward will store: JSON that PostgreSQL's ``jsonb`` (and ``text``) can hold.

Python's ``json`` module and PyYAML accept documents that PostgreSQL refuses, or that hurt on
the way in; each of these is refused here, before anything is stored, with ``InvalidInput``
naming the problem and where it is (``$.a.b[3]``):

* nesting deeper than ``MAX_DEPTH`` levels (``json.loads`` of 50,000 ``[`` raises
  ``RecursionError``; deep documents are also slow to walk for every later reader);
* ``\\u0000`` in a string or a key (``jsonb`` and ``text`` cannot hold NUL);
* a lone surrogate such as ``"\\ud800"`` (not encodable as UTF-8);
* ``NaN``, ``Infinity``, ``-Infinity``, and numbers too large for a float (``1e400``);
  integers with more than ``MAX_INT_DIGITS`` digits;
* bytes that are not UTF-8;
* with ``max_bytes``: a value larger than that once expanded (a YAML document whose aliases
  repeat one node many times, a Python structure sharing a sub-list many times).

``parse_json`` is for text from outside (request bodies, ``--payload``); ``check_storable`` for
values that did not come from JSON text (a dict given to the library, a loaded YAML document);
``check_text`` for single strings stored as ``text`` (ids, keys, filters).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from onward.errors import InvalidInput

MAX_DEPTH = 64
"""The deepest nesting of objects and lists accepted (the top-level value is level 1)."""

MAX_INT_DIGITS = 4300
"""Python's own limit for integer text (``sys.get_int_max_str_digits``); ``jsonb`` takes more."""

_INT_LIMIT = 10**MAX_INT_DIGITS
_PATH_SEGMENTS = 12
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', re.DOTALL)


class _Unstorable:
    """What the JSON parser hands back for a constant jsonb cannot hold (found by the walk)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Problem(Exception):
    """Raised inside the walk; each level adds its key on the way out, so the path is built
    only when there is a problem."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []


def path_text(path: list[str | int]) -> str:
    """``["a", "b", 3]`` as ``$.a.b[3]``; long paths are cut after a few segments."""
    parts = ["$"]
    for segment in path[:_PATH_SEGMENTS]:
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        elif _IDENTIFIER.match(segment):
            parts.append(f".{segment}")
        else:
            shown = segment if len(segment) <= 40 else segment[:40] + "..."
            parts.append(f"[{json.dumps(shown)}]")
    if len(path) > _PATH_SEGMENTS:
        parts.append(f"...({len(path) - _PATH_SEGMENTS} more levels)")
    return "".join(parts)


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "\\u0000 (NUL) cannot be stored in a string"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"a lone surrogate (\\u{ord(text[exc.start]):04x}) is not valid Unicode text"
    return None


def check_text(value: str, what: str) -> str:
    """``value`` if it can be stored as PostgreSQL ``text``; else ``InvalidInput``."""
    problem = _string_problem(value)
    if problem is not None:
        raise InvalidInput(f"{what}: {problem}")
    return value


class _Walk:
    """One walk over a value: depth, strings, numbers, leaf types and (optionally) the size it
    has once serialised, counting a shared node each time it is reached."""

    def __init__(self, *, strings: bool, loose: bool, max_bytes: int | None) -> None:
        self.strings = strings
        self.loose = loose
        self.budget = max_bytes
        self.max_bytes = max_bytes

    def spend(self, n: int) -> None:
        if self.budget is not None:
            self.budget -= n
            if self.budget < 0:
                raise _Problem(f"larger than {self.max_bytes} bytes once expanded")

    def string(self, text: str) -> None:
        self.spend(len(text) + 2)
        if self.strings:
            problem = _string_problem(text)
            if problem is not None:
                raise _Problem(problem)

    def value(self, value: Any, depth: int) -> None:
        if isinstance(value, str):
            self.string(value)
        elif isinstance(value, dict):
            self.mapping(value, depth)
        elif isinstance(value, list | tuple):
            self.sequence(value, depth)
        elif value is None or isinstance(value, bool):
            self.spend(4)
        elif isinstance(value, int):
            self.spend(1)
            if not -_INT_LIMIT < value < _INT_LIMIT:
                raise _Problem(f"an integer with more than {MAX_INT_DIGITS} digits")
        elif isinstance(value, float):
            self.spend(1)
            if not self.loose and not math.isfinite(value):
                raise _Problem(f"{value!r} is not a number JSON or PostgreSQL can store")
        elif isinstance(value, _Unstorable):
            raise _Problem(f"{value.text} is not a number JSON or PostgreSQL can store")
        elif not self.loose:
            raise _Problem(
                f"a {type(value).__name__} is not JSON "
                "(strings, numbers, booleans, null, lists and objects only)"
            )

    def mapping(self, value: dict[Any, Any], depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise _Problem(f"nested deeper than {MAX_DEPTH} levels")
        self.spend(2)
        for key, item in value.items():
            try:
                if isinstance(key, str):
                    self.string(key)
                elif not self.loose:
                    raise _Problem(f"an object key must be a string, not {type(key).__name__}")
                self.spend(1)
                self.value(item, depth + 1)
            except _Problem as exc:
                exc.path.append(key if isinstance(key, str) else str(key))
                raise

    def sequence(self, value: list[Any] | tuple[Any, ...], depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise _Problem(f"nested deeper than {MAX_DEPTH} levels")
        self.spend(2)
        for index, item in enumerate(value):
            try:
                self.spend(1)
                self.value(item, depth + 1)
            except _Problem as exc:
                exc.path.append(index)
                raise

    def check(self, value: Any, what: str) -> None:
        try:
            self.value(value, 0)
        except _Problem as exc:
            exc.path.reverse()
            raise InvalidInput(f"{what}: {path_text(exc.path)}: {exc.problem}") from None


def check_storable(
    value: Any, what: str, *, max_bytes: int | None = None, loose: bool = False
) -> None:
    """Refuse (``InvalidInput``) a value that cannot be stored as ``jsonb`` as it is.

    ``what`` names the value in the message (``"the payload"``). ``max_bytes``: refuse a value
    whose JSON would be larger (a lower bound, counted as the walk goes, so an alias bomb stops
    early). ``loose``: check only what hurts on the way in -- depth, size, strings PostgreSQL
    cannot store, integers too long to serialise -- and leave other leaves (a YAML date, a
    non-finite float, an integer key) to the caller's own validation."""
    _Walk(strings=True, loose=loose, max_bytes=max_bytes).check(value, what)


def _too_deep_at(text: str) -> str:
    """Where a document first goes deeper than ``MAX_DEPTH`` (only for refused documents)."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, match.start()) + 1
                column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
                return f"line {line} column {column}"
        elif token in "]}":
            depth -= 1
    return "somewhere"  # pragma: no cover - only reached when the parser itself overflowed


def _unstorable_float(text: str) -> Any:
    number = float(text)
    return number if math.isfinite(number) else _Unstorable(text)


def parse_json(text: str | bytes, what: str) -> Any:
    """Parse JSON text from outside, refusing with ``InvalidInput`` what cannot be stored.

    ``what`` names the input in the message (``"the body"``, ``"--payload"``). An empty text
    is refused too: the caller decides whether an empty body means ``{}``."""
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{what}: not UTF-8 (invalid byte at offset {exc.start})") from None
        surrogates = False  # strict UTF-8 decoding never yields a surrogate
    else:
        surrogates = not text.isascii() and _has_surrogate(text)
    if text.startswith("\ufeff"):
        text = text[1:]
    unstorable = False

    def constant(name: str) -> _Unstorable:
        nonlocal unstorable
        unstorable = True
        return _Unstorable(name)

    def floating(number: str) -> Any:
        nonlocal unstorable
        parsed = _unstorable_float(number)
        unstorable = unstorable or isinstance(parsed, _Unstorable)
        return parsed

    try:
        value = json.loads(text, parse_constant=constant, parse_float=floating)
    except RecursionError:
        raise InvalidInput(
            f"{what}: nested deeper than {MAX_DEPTH} levels (at {_too_deep_at(text)})"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{what}: not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None
    except ValueError:  # an integer longer than Python's digit limit
        raise InvalidInput(f"{what}: an integer with more than {MAX_INT_DIGITS} digits") from None
    strings = surrogates or "\\u" in text
    shallow = text.count("[") + text.count("{") <= MAX_DEPTH
    if strings or unstorable or not shallow:
        _Walk(strings=strings, loose=False, max_bytes=None).check(value, what)
    return value


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
