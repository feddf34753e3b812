"""Certificates signed by a CA of the test's own, for the TLS tests."""

from __future__ import annotations

import datetime


def issue(ca_cert: str, ca_key: str, common_name: str) -> tuple[str, str]:
    """A certificate for ``common_name`` signed by the CA, and its key, as PEM text."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    issuer = x509.load_pem_x509_certificate(ca_cert.encode())
    signing_key = serialization.load_pem_private_key(ca_key.encode(), None)
    assert isinstance(signing_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(signing_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()
