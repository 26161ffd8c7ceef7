"""The node side of mutual TLS: the node's own key and CSR (the key never travels), and the
client ``ssl.SSLContext`` a remote child dials back with. Stdlib ``ssl`` plus ``cryptography``;
never ``orchestrator`` (DESIGN §1)."""

from __future__ import annotations

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


def make_key_and_csr(directory: Path, session: str, owner: str) -> bytes:
    """Write a fresh key to ``directory/key.pem`` (0600, new file) and return a PEM CSR for
    ``fleet://SESSION/OWNER``. Only the CSR goes to the supervisor."""
    key = ec.generate_private_key(ec.SECP256R1())
    uri = f"fleet://{session}/{owner}"
    key_path = directory / "key.pem"
    if key_path.exists():
        key_path.unlink()  # renewal: a new key each time, never reuse
    _write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, uri)]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


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


def dial_context(directory: Path) -> ssl.SSLContext:
    """The client context from ``directory`` (key, leaf, CA), then the key file is removed:
    from here on the key lives in this process only, out of reach of the backend this child
    starts next in the same sandbox."""
    key = directory / "key.pem"
    context = client_context(key, directory / "cert.pem", directory / "ca.pem")
    key.unlink(missing_ok=True)
    return context


def _main(argv: list[str]) -> int:
    """``python -m child._tls DIR SESSION OWNER``: run on the node by the child's actor, before
    the child starts. Makes DIR (0700, new), writes the key there and prints the CSR."""
    import sys  # noqa: PLC0415 - the command line only

    if len(argv) != 3:
        print("usage: python -m child._tls DIR SESSION OWNER", file=sys.stderr)
        return 2
    from pathlib import Path  # noqa: PLC0415 - the command line only

    directory = Path(argv[0])
    try:
        directory.mkdir(mode=0o700)
        sys.stdout.buffer.write(make_key_and_csr(directory, argv[1], argv[2]))
    except OSError as exc:
        print(f"child._tls: {directory}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
