"""Server TLS for the ext_proc port: a self-signed certificate by default, or files that are
re-read when they change (cert-manager rotates them in place)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = structlog.get_logger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"


def self_signed(common_name: str = "inference-gateway") -> tuple[bytes, bytes]:
    """A fresh (key PEM, certificate PEM) pair valid for localhost, 127.0.0.1 and ::1.

    Envoy is configured not to verify it, as upstream does for its generated certificate.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName(common_name),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


class ReloadingCertificate:
    """``tls.crt``/``tls.key`` in a directory, re-read on the next handshake after they change."""

    def __init__(self, cert_dir: str | os.PathLike[str]) -> None:
        self.cert_path = Path(cert_dir) / CERT_FILE
        self.key_path = Path(cert_dir) / KEY_FILE
        self._stamp = self._mtimes()
        self.pair = self._read()

    def _mtimes(self) -> tuple[float, float]:
        return self.cert_path.stat().st_mtime, self.key_path.stat().st_mtime

    def _read(self) -> tuple[bytes, bytes]:
        return self.key_path.read_bytes(), self.cert_path.read_bytes()

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's per-handshake hook: a new configuration when the files changed, else None."""
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return None
            pair = self._read()
        except OSError as e:
            log.warning("certificate reload failed; keeping the old one", error=str(e))
            return None
        self._stamp, self.pair = stamp, pair
        log.info("certificate reloaded", path=str(self.cert_path))
        return grpc.ssl_server_certificate_configuration([pair])


def server_credentials(cert_path: str | None,
                       client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS credentials: from ``cert_path`` (a directory with tls.crt and tls.key, reloaded on
    change) or a self-signed certificate made now. With ``client_ca`` (a PEM file) clients
    must present a certificate it signed (mTLS): without it any TLS client may open streams
    (issue 31: 200 rogue streams held 200 in-flight counts)."""
    roots = Path(client_ca).read_bytes() if client_ca else None
    if not cert_path:
        return grpc.ssl_server_credentials([self_signed()], root_certificates=roots,
                                           require_client_auth=roots is not None)
    source = ReloadingCertificate(cert_path)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        changed = source.fetch()
        if changed is None or roots is None:
            return changed
        return grpc.ssl_server_certificate_configuration([source.pair], roots)

    return grpc.dynamic_ssl_server_credentials(
        grpc.ssl_server_certificate_configuration([source.pair], roots), fetch,
        require_client_authentication=roots is not None)
