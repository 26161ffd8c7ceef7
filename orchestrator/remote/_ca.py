"""The per-session CA: in-memory key, owner-bound leaves, the server TLS context."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Leaf lifetime: renew well before this (the brief's window is 30-60 minutes).
LEAF_LIFETIME = dt.timedelta(minutes=45)
CA_LIFETIME = dt.timedelta(days=2)


class CertificateRefused(ValueError):
    """A CSR the CA will not sign; the message is one clear line."""


def owner_uri(session: str, owner: str) -> str:
    return f"fleet://{session}/{owner}"


def owner_of(cert: x509.Certificate, session: str) -> str | None:
    """The owner a certificate is bound to in ``session``, or None if it names none."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    prefix = f"fleet://{session}/"
    matching = [
        u[len(prefix) :]
        for u in san.get_values_for_type(x509.UniformResourceIdentifier)
        if u.startswith(prefix)
    ]
    return matching[0] if len(matching) == 1 and matching[0] else None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class SessionCA:
    """One session's CA. The private key never leaves this object (no file, no export)."""

    def __init__(self, session: str) -> None:
        self.session = session
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fleet session {session} CA")])
        now = _now()
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def sign(
        self,
        csr_pem: bytes,
        owner: str,
        *,
        lifetime: dt.timedelta = LEAF_LIFETIME,
        not_before: dt.datetime | None = None,
    ) -> bytes:
        """Sign ``csr_pem`` for ``owner``; refuse a CSR that asks for anything else."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise CertificateRefused("certificate request refused: not a PEM CSR") from exc
        if not csr.is_signature_valid:
            raise CertificateRefused("certificate request refused: bad CSR signature")
        wanted = owner_uri(self.session, owner)
        cns = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        try:
            san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        except x509.ExtensionNotFound:
            uris = []
        if cns != [wanted] or uris not in ([], [wanted]):
            asked = ", ".join([*map(str, cns), *uris]) or "nothing"
            raise CertificateRefused(
                f"certificate request refused: it names {asked}, not owner {owner!r}"
            )
        start = not_before or _now() - dt.timedelta(minutes=1)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, wanted)]))
            .issuer_name(self.certificate.subject)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + lifetime)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(wanted)]),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return leaf.public_bytes(serialization.Encoding.PEM)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server context: its own leaf for ``host``, client certificates from this CA only."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet supervisor")]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.certificate_pem.decode())
        # load_cert_chain takes paths only: a private 0700 temp dir, removed at once.
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "server.pem"
            path.touch(mode=0o600)
            path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
                + cert.public_bytes(serialization.Encoding.PEM)
            )
            context.load_cert_chain(path)
        # No session tickets: every child is a new process with a key of its own, so none
        # would ever resume, and each handshake cost both ends two tickets (0.55 ms here).
        context.num_tickets = 0
        return context


def seconds_left(cert: bytes | x509.Certificate) -> float:
    """How long a certificate (PEM or parsed) is still valid, in seconds (negative: expired)."""
    if isinstance(cert, bytes):
        cert = x509.load_pem_x509_certificate(cert)
    return (cert.not_valid_after_utc - _now()).total_seconds()


def check_peer(ssl_object: ssl.SSLObject | ssl.SSLSocket, session: str, hello_owner: str) -> None:
    """At hello: the verified peer certificate must be bound to the hello's owner."""
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        raise CertificateRefused("hello refused: no client certificate")
    bound = owner_of(x509.load_der_x509_certificate(der), session)
    if bound != hello_owner:
        raise CertificateRefused(
            f"hello refused: certificate is for owner {bound!r}, hello claims {hello_owner!r}"
        )
