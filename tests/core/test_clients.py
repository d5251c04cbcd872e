"""`proxy.frontend.clients.ClientIdentity`: the one key every per-client limit counts by."""

from __future__ import annotations

import logging

import pytest

from proxy.frontend.clients import ClientIdentity


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # the same /64: the same client
        ("::ffff:198.51.100.4", "198.51.100.4"),
    ],
)
def test_the_key_is_the_address_an_ipv6_client_by_its_64(peer: str, key: str) -> None:
    assert ClientIdentity(trusts_proxies=False).key({"client": (peer, 5000)}, {}) == key


def test_no_peer_is_no_key() -> None:
    assert ClientIdentity(trusts_proxies=False).key({"client": None}, {}) is None


def test_an_untrusted_x_forwarded_for_is_not_read_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    identity = ClientIdentity(trusts_proxies=False)
    with caplog.at_level(logging.WARNING, logger="proxy.frontend.clients"):
        for _ in range(3):
            key = identity.key({"client": ("10.0.0.5", 1)}, {"x-forwarded-for": "203.0.113.1"})
            assert key == "10.0.0.5"
    assert sum("--forwarded-allow-ips" in r.getMessage() for r in caplog.records) == 1
