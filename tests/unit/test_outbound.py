"""The outbound check's address table and allow-list syntax (onward.outbound), without I/O."""

from __future__ import annotations

import ipaddress

import pytest

from onward.errors import InvalidInput
from onward.outbound import AllowList, parse_entry, refusal


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.8.9.10", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),  # IPv4-mapped: checked as IPv4
        ("10.0.0.1", "a private address"),
        ("172.16.5.4", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd12:3456::1", "a private address"),  # ULA
        ("169.254.169.254", "a cloud metadata address"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("100.64.0.1", "a reserved address (not globally routable)"),
        ("240.0.0.1", "a reserved address (not globally routable)"),
    ],
)
def test_non_public_addresses_are_refused_with_their_reason(address: str, reason: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("10.0.0.1/8", "10.0.0.0/8"),
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1/32", "127.0.0.1"),
        ("127.0.0.1:8099", "127.0.0.1:8099"),
        ("::1", "::1"),
        ("[::1]:8099", "[::1]:8099"),
        ("[fd00::/8]:443", "[fd00::/8]:443"),
        ("10.0.0.0/8:443", "10.0.0.0/8:443"),
        ("Hooks.Internal.", "hooks.internal"),
        ("hooks.internal:8443", "hooks.internal:8443"),
    ],
)
def test_entries_are_stored_in_canonical_form(raw: str, canonical: str) -> None:
    assert str(parse_entry(raw)) == canonical


@pytest.mark.parametrize(
    "raw", ["", " ", "a b", "a/b/c", "127.0.0.1:0", "127.0.0.1:70000", "[::1", "x:y", "hé.test"]
)
def test_bad_entries_are_refused_with_the_syntax(raw: str) -> None:
    with pytest.raises(InvalidInput, match="optionally with :port"):
        parse_entry(raw)


def test_an_entry_allows_its_addresses_its_port_and_its_name() -> None:
    allow = AllowList(
        (parse_entry("127.0.0.1:8099"), parse_entry("10.0.0.0/8"), parse_entry("hooks.internal"))
    )
    ip = ipaddress.ip_address
    assert allow.allows("127.0.0.1", ip("127.0.0.1"), 8099)
    assert not allow.allows("127.0.0.1", ip("127.0.0.1"), 8100)  # another port
    assert not allow.allows("::1", ip("::1"), 8099)  # another address
    assert allow.allows("x", ip("10.9.8.7"), 1)
    assert not allow.allows("x", ip("11.0.0.1"), 1)
    assert allow.allows("HOOKS.internal.", ip("192.168.0.9"), 443)  # by its name
    assert not allow.allows("other.internal", ip("192.168.0.9"), 443)
