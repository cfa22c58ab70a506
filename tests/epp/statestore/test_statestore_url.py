"""``--state-store`` URLs: what is accepted, and a one-line answer for everything else."""

from __future__ import annotations

import pytest

from epp.statestore import StoreURLError, parse_store_url


def test_memory_url_shares_nothing() -> None:
    assert parse_store_url("memory://").kind == "memory"


def test_valkey_url_defaults_port_db_and_namespace() -> None:
    u = parse_store_url("valkey://cache.svc")
    assert (u.kind, u.host, u.port, u.db, u.tls, u.namespace) == (
        "valkey", "cache.svc", 6379, 0, False, "gie")


def test_valkey_url_takes_auth_port_and_db() -> None:
    u = parse_store_url("valkey://epp:p%40ss@10.0.0.9:7000/3")
    assert (u.username, u.password, u.host, u.port, u.db) == ("epp", "p@ss", "10.0.0.9", 7000, 3)


def test_password_only_auth_as_redis_urls_write_it() -> None:
    u = parse_store_url("valkey://:secret@h:1/0")
    assert (u.username, u.password) == (None, "secret")


def test_valkeys_means_tls_with_its_options() -> None:
    u = parse_store_url("valkeys://h/1?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none"
                        "&ssl_check_hostname=true")
    assert u.tls
    assert u.tls_options == {"ssl_ca_certs": "/ca.pem", "ssl_cert_reqs": "none",
                             "ssl_check_hostname": True}


def test_redis_schemes_are_aliases() -> None:
    assert parse_store_url("redis://h").tls is False
    assert parse_store_url("rediss://h").tls is True


def test_store_options() -> None:
    u = parse_store_url("valkey://h?namespace=team-a&timeout=0.2&sync_interval=0.1")
    assert (u.namespace, u.timeout, u.sync_interval) == ("team-a", 0.2, 0.1)


def test_redacted_url_hides_the_password() -> None:
    text = parse_store_url("valkeys://u:hunter2@h:1/2").redacted()
    assert "hunter2" not in text
    assert text == "valkeys://u:***@h:1/2"


@pytest.mark.parametrize(("url", "says"), [
    ("http://h", "unknown scheme 'http'"),
    ("valkey://", "no host"),
    ("valkey://h/zero", "database 'zero' is not a number"),
    ("valkey://h:99999", "bad port"),
    ("valkey://h?tiemout=1", "unknown option 'tiemout'"),
    ("valkey://h?ssl_ca_certs=/x", "needs TLS"),
    ("valkeys://h?ssl_cert_reqs=maybe", "ssl_cert_reqs must be"),
    ("valkeys://h?ssl_check_hostname=yes", "ssl_check_hostname must be"),
    ("valkey://h?timeout=-1", "timeout must be > 0"),
    ("valkey://h?sync_interval=fast", "is not a number"),
    ("valkey://h?namespace=a:b", "namespace"),
    ("memory://somewhere", "memory:// takes nothing"),
])
def test_bad_urls_are_refused_with_one_line(url: str, says: str) -> None:
    with pytest.raises(StoreURLError, match=says) as info:
        parse_store_url(url)
    assert "\n" not in str(info.value)
