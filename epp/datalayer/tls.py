"""TLS of the data layer's HTTP sources (llm-d-router v0.10's ``insecureSkipVerify``,
``caCertPath``, ``clientCertPath``/``clientKeyPath`` of ``metrics-data-source``,
``models-data-source`` and ``dcgm-data-source``)."""

from __future__ import annotations

import ssl
from pathlib import Path


def check_tls_files(ca_cert_path: str | None, client_cert_path: str | None,
                    client_key_path: str | None) -> None:
    """ValueError naming the parameter when a file is missing or the pair is incomplete."""
    if bool(client_cert_path) != bool(client_key_path):
        raise ValueError("clientCertPath and clientKeyPath: set both together")
    for key, path in (("caCertPath", ca_cert_path), ("clientCertPath", client_cert_path),
                      ("clientKeyPath", client_key_path)):
        if path and not Path(path).is_file():
            raise ValueError(f"{key}: no such file {path!r}")


def client_ssl(scheme: str, insecure_skip_verify: bool, ca_cert_path: str | None = None,
               client_cert_path: str | None = None,
               client_key_path: str | None = None) -> ssl.SSLContext | bool:
    """What aiohttp's connector gets: ``True`` (default verification, or plain http), or a
    context that verifies against ``caCertPath`` / skips verification, and presents the
    client certificate when one is given."""
    if scheme != "https":
        return True
    if not (insecure_skip_verify or ca_cert_path or client_cert_path):
        return True
    ctx = ssl.create_default_context(cafile=ca_cert_path or None)
    if insecure_skip_verify and not ca_cert_path:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if client_cert_path and client_key_path:
        ctx.load_cert_chain(client_cert_path, client_key_path)
    return ctx
