"""The node side of mutual TLS: the node's own key and CSR (the key never travels), and the
client ``ssl.SSLContext`` a remote child dials back with. Stdlib ``ssl`` plus ``cryptography``;
never ``orchestrator`` (DESIGN §1)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import ssl
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

if TYPE_CHECKING:
    from pathlib import Path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def new_key_and_csr(session: str, owner: str) -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    """A fresh key (in memory) and a PEM CSR for ``fleet://SESSION/OWNER``."""
    key = ec.generate_private_key(ec.SECP256R1())
    uri = f"fleet://{session}/{owner}"
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, uri)]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return key, csr.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_key_and_csr(directory: Path, session: str, owner: str) -> bytes:
    """Write a fresh key to ``directory/key.pem`` (0600, new file) and return a PEM CSR for
    ``fleet://SESSION/OWNER``. Only the CSR goes to the supervisor."""
    key, csr = new_key_and_csr(session, owner)
    key_path = directory / "key.pem"
    if key_path.exists():
        key_path.unlink()  # renewal: a new key each time, never reuse
    _write_private(key_path, _key_pem(key))
    return csr


class Credentials:
    """A remote child's key and leaf, in this process only once it has dialled back, and the
    renewal of the leaf over the channel (``child._lease`` asks :meth:`due` each lease tick).

    A renewal makes a new key and CSR here; the supervisor's answer is taken only if it is a
    leaf for this very key and owner. The renewed pair is what a later connection would present.
    """

    def __init__(self, key: bytes, cert: bytes, session: str, owner: str) -> None:
        self.key, self.cert = key, cert
        self.session, self.owner = session, owner
        self._pending: ec.EllipticCurvePrivateKey | None = None
        self.renewals = 0

    @classmethod
    def take(cls, directory: Path, session: str, owner: str) -> tuple[Credentials, ssl.SSLContext]:
        """The context to dial with from ``directory``, and the credentials; the key file is
        removed: from here on the key lives in this process only, out of reach of the backend
        this child starts next in the same sandbox."""
        key_path = directory / "key.pem"
        context = client_context(key_path, directory / "cert.pem", directory / "ca.pem")
        key = key_path.read_bytes()
        key_path.unlink(missing_ok=True)
        return cls(key, (directory / "cert.pem").read_bytes(), session, owner), context

    def _leaf(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert)

    def due(self, now: float | None = None) -> bool:
        """The leaf is past two thirds of its life (renew now)."""
        import time  # noqa: PLC0415 - this module's only clock

        leaf = self._leaf()
        start, end = leaf.not_valid_before_utc.timestamp(), leaf.not_valid_after_utc.timestamp()
        return (time.time() if now is None else now) >= start + (end - start) * 2 / 3

    def csr(self) -> str:
        """A CSR for a new key (kept pending until its leaf comes back)."""
        self._pending, csr = new_key_and_csr(self.session, self.owner)
        return csr.decode()

    def accept(self, leaf_pem: str) -> None:
        """Take the renewed leaf; ValueError unless it is for the pending key and our owner."""
        leaf = x509.load_pem_x509_certificate(leaf_pem.encode())
        pending, self._pending = self._pending, None
        if pending is None or leaf.public_key() != pending.public_key():
            raise ValueError("the renewed certificate is not for the key this child asked with")
        uri = f"fleet://{self.session}/{self.owner}"
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        if san.get_values_for_type(x509.UniformResourceIdentifier) != [uri]:
            raise ValueError(f"the renewed certificate does not name {uri}")
        self.key, self.cert = _key_pem(pending), leaf_pem.encode()
        self.renewals += 1


def warm() -> None:
    """Do once, in a fork server before its first fork, what a fresh fork would otherwise do in
    every remote child: OpenSSL's and ``cryptography``'s first key, certificate, context,
    handshake and record (each algorithm's first fetch, the PEM decoders, the certificate
    parser). A throwaway key and a self-signed certificate for ``warm`` that nobody trusts shake
    hands with themselves in memory (no file: the key and certificate are read from a memfd) and
    send one record each way. A remote child's credentials, dial and 20 round trips then cost
    its fork 7.5 ms of CPU against 8.6 ms (0.85, the median of 10 rounds of 40 forks:
    ``benchmarks/fork_tls.py``). OpenSSL reseeds its random generator in each fork (it notices
    the new process), so no two forks draw the same keys. Linux only (memfd); elsewhere it does
    nothing."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        return
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "warm")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(minutes=5))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("warm")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    fd = memfd_create("fleet-warm", os.MFD_CLOEXEC)
    try:
        os.write(fd, _key_pem(key) + cert_pem)
        path = f"/proc/self/fd/{fd}"
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.minimum_version = ssl.TLSVersion.TLSv1_3
        server.verify_mode = ssl.CERT_REQUIRED
        server.load_cert_chain(path)
        server.load_verify_locations(cadata=cert_pem.decode())
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=cert_pem.decode())
        client.minimum_version = ssl.TLSVersion.TLSv1_3
        client.load_cert_chain(path)
    finally:
        os.close(fd)
    to_server, from_server, to_client, from_client = (ssl.MemoryBIO() for _ in range(4))
    near = server.wrap_bio(to_server, from_server, server_side=True)
    far = client.wrap_bio(to_client, from_client, server_hostname="warm")
    for _ in range(8):  # a TLS 1.3 handshake with client certificates takes three flights
        for end in (far, near):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
        to_server.write(from_client.read())
        to_client.write(from_server.read())
    far.write(b"warm")
    to_server.write(from_client.read())
    near.read()
    near.write(b"warm")
    to_client.write(from_server.read())
    far.read()
    x509.load_der_x509_certificate(near.getpeercert(binary_form=True) or b"")


def install_certificate(directory: Path, cert_pem: bytes, ca_pem: bytes) -> None:
    """Store the signed leaf and the session CA beside the key, each 0600."""
    for name, data in (("cert.pem", cert_pem), ("ca.pem", ca_pem)):
        path = directory / name
        if path.exists():
            path.unlink()
        _write_private(path, data)


def client_context(key: Path, cert: Path, ca: Path) -> ssl.SSLContext:
    """The context a remote child dials ``tls://host:port`` with: trusts only the session CA."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return context
