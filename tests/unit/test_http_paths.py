"""``http.call`` keeps a connection's token at its own base URL: ``url_under`` resolves a path
under the base URL or refuses it (PermanentError) before any request exists. Pure logic; the
real requests (none to another host) are in tests/integration/test_connectors.py."""

from __future__ import annotations

import pytest

from onward.connectors.http import url_under
from onward.errors import PermanentError

BASE = "https://api.example.test/v2"


@pytest.mark.parametrize(
    ("path", "url"),
    [
        ("/", f"{BASE}/"),
        ("", f"{BASE}/"),
        ("/messages", f"{BASE}/messages"),
        ("messages", f"{BASE}/messages"),
        ("/items/", f"{BASE}/items/"),
        ("/a/./b", f"{BASE}/a/b"),
        ("/a/../b", f"{BASE}/b"),  # '..' that stays inside is resolved here
        ("/a/%2e%2e/b", f"{BASE}/b"),
        ("/a//b", f"{BASE}/a/b"),
        ("/search?q=a/../b&next=//x", f"{BASE}/search?q=a/../b&next=//x"),  # a query is a query
        ("/v1/documents:batchGet", f"{BASE}/v1/documents:batchGet"),
        ("/users/%41%20b", f"{BASE}/users/%41%20b"),  # encodings that stay are kept as sent
        ("/@evil.test/x", f"{BASE}/@evil.test/x"),  # a path segment, not userinfo
        (f"{BASE}/messages", f"{BASE}/messages"),  # an absolute URL under the base
        (f"{BASE}?page=2", f"{BASE}/?page=2"),
        (BASE, f"{BASE}/"),
    ],
)
def test_a_path_under_the_base_url_is_resolved(path: str, url: str) -> None:
    assert url_under(BASE + "/", path) == url
    assert url_under(BASE, path) == url


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("https://evil.test/steal", "absolute URL"),
        ("HTTP://evil.test/steal", "absolute URL"),
        ("http:evil.test/steal", "absolute URL"),
        ("javascript:alert(1)", "absolute URL"),
        ("https://api.example.test/v2evil/x", "absolute URL"),  # not under /v2/
        ("https://api.example.test/v2@evil.test/x", "absolute URL"),
        ("https://api.example.test.evil.test/v2/x", "absolute URL"),
        ("//evil.test/steal", "scheme-relative"),
        ("///evil.test/steal", "scheme-relative"),
        ("\\\\evil.test\\steal", "backslash"),
        ("/\\evil.test/steal", "backslash"),
        ("/a%5c..%5c..%5csteal", "encoded '/' or '\\'"),
        ("..", "above the base path"),
        ("../steal", "above the base path"),
        ("/../steal", "above the base path"),
        ("/a/../../steal", "above the base path"),
        ("%2e%2e/steal", "above the base path"),
        ("%2E%2E/steal", "above the base path"),
        (".%2e/steal", "above the base path"),
        ("%252e%252e/steal", "above the base path"),  # decoded twice by some servers
        ("..%2fsteal", "encoded '/' or '\\'"),
        ("%2f%2fevil.test/steal", "encoded '/' or '\\'"),
        ("https://api.example.test/v2/../steal", "above the base path"),
        ("\t//evil.test/steal", "control characters"),
        ("/a\n/b", "control characters"),
        ("/a%0d%0aHost:%20evil", "encoded control characters"),
        ("/a#https://evil.test", "fragment"),
    ],
)
def test_a_path_that_leaves_the_base_url_is_refused(path: str, why: str) -> None:
    with pytest.raises(PermanentError) as caught:
        url_under(BASE, path)

    assert why in str(caught.value)
    assert caught.value.detail["base_url"] == BASE
    assert not caught.value.retryable
