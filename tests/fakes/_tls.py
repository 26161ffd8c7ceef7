"""A test certificate authority: a loopback HTTPS server stands in for a model provider.

:class:`TestCA` makes a CA and one server leaf for ``127.0.0.1``/``localhost`` with the
``cryptography`` package; :meth:`TestCA.write` puts the CA certificate where a client can trust
it (a supervisor is pointed at it with ``SSL_CERT_FILE``), and :meth:`TestCA.server_context`
is what the server wraps its listener with.
"""

import datetime as dt
import ipaddress
import ssl
import tempfile
from pathlib import Path

import attrs
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ipc import SocketTLSStream, tls_over

_DAY = dt.timedelta(days=1)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


@attrs.define(eq=False)
class TestCA:
    """A CA and a server certificate for loopback signed by it."""

    __test__ = False  # not a pytest test class

    _key: ec.EllipticCurvePrivateKey = attrs.field(
        factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    _cert: x509.Certificate | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name("fleet test CA"))
            .issuer_name(_name("fleet test CA"))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def certificate(self) -> x509.Certificate:
        assert self._cert is not None
        return self._cert

    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def write(self, path: Path) -> Path:
        """The CA certificate at *path* (a bundle holding only it): a client's trust store."""
        path.write_bytes(self.pem())
        return path

    def server_context(self) -> ssl.SSLContext:
        """A server context with a fresh leaf for ``127.0.0.1``, ``::1`` and ``localhost``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        names = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
        leaf = (
            x509.CertificateBuilder()
            .subject_name(_name("localhost"))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + _DAY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as directory:
            cert_file = Path(directory) / "cert.pem"
            key_file = Path(directory) / "key.pem"
            cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
            key_file.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            context.load_cert_chain(cert_file, key_file)
        return context


async def tls_pair(
    tmp_path: Path, nursery: trio.Nursery
) -> tuple[SocketTLSStream, SocketTLSStream]:
    """A connected client and server ``SocketTLSStream`` over loopback TCP, handshakes
    done (a fresh CA; the client checks the server's certificate)."""
    ca = TestCA()
    server_context = ca.server_context()
    client_context = ssl.create_default_context(cafile=str(ca.write(tmp_path / "ca.pem")))
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    accepted: list[SocketTLSStream] = []
    ready = trio.Event()

    async def accept() -> None:
        tcp = await listener.accept()
        server = tls_over(tcp, server_context, server_side=True)
        await server.do_handshake()
        accepted.append(server)
        ready.set()

    nursery.start_soon(accept)
    client = tls_over(
        await trio.open_tcp_stream("127.0.0.1", port), client_context, server_hostname="127.0.0.1"
    )
    await client.do_handshake()
    await ready.wait()
    await listener.aclose()
    return client, accepted[0]
