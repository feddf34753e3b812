"""TLS contexts and certificates: what a listener shows and what a connecting side checks.

Certificates, keys and CAs may be given as file paths or as PEM text
(``-----BEGIN ...``), as Dask's ``Security`` accepts. ``temporary_certificates`` makes a
self-signed pair for a cluster that wants encryption without a CA of its own.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: OpenSSL's decorations around the reason: ``[SSL: CODE] reason (_ssl.c:1006)``.
_OPENSSL_CODE = re.compile(r"^\[[^\]]*\]\s*")
_OPENSSL_PLACE = re.compile(r"\s*\(_ssl\.c:\d+\)$")


def tls_reason(exc: BaseException) -> str:
    """The reason of a TLS or socket error on one line, as a person would say it."""
    if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError) and exc.strerror:
        return exc.strerror
    text = _OPENSSL_PLACE.sub("", _OPENSSL_CODE.sub("", str(exc))).strip()
    if text:
        return " ".join(text.split())
    if isinstance(exc, ConnectionResetError):  # asyncio raises the bare class at EOF
        return "the peer closed the connection"
    return type(exc).__name__


def server_context(
    cert: str,
    key: str | None,
    ca: str | None,
    *,
    ciphers: str | None = None,
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
) -> ssl.SSLContext:
    """A listener's context: it shows ``cert`` (with ``key``; ``None``: the key is in
    ``cert``). With ``ca``, mutual TLS: clients must show a certificate that ``ca``
    signed. Each of ``cert``, ``key`` and ``ca`` is a file path or PEM text.

    ``ciphers`` (OpenSSL's syntax) limits the TLS 1.2 ciphers; TLS 1.3 has its own
    short list of strong suites, which it leaves alone. Bad files raise a one-line
    ``ValueError`` naming the file.
    """
    # What create_default_context(Purpose.CLIENT_AUTH) makes, without the system's CAs:
    # under mutual TLS only the cluster's own CA may vouch for a client.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(context, ciphers, min_version)
    _load_chain(context, cert, key)
    if ca is not None:
        _load_ca(context, ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca: str | None,
    cert: str | None,
    key: str | None,
    *,
    ciphers: str | None = None,
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
) -> ssl.SSLContext:
    """A connecting side's context. With ``ca``, the server must show a certificate
    that ``ca`` signed. Without it nothing is verified: the connection is encrypted
    but could be intercepted by whoever can impersonate the server, which is weaker.
    ``cert`` (and ``key``, if not in ``cert``) is shown to servers that ask for one
    (mutual TLS). Each is a file path or PEM text; see ``server_context``.
    """
    # PROTOCOL_TLS_CLIENT is Purpose.SERVER_AUTH's protocol; it loads no system CAs.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _configure(context, ciphers, min_version)
    # Host names are not checked: a cluster addresses its nodes by IP, often ones
    # assigned at start-up, and its CA is its own, so a certificate that CA signed is
    # the proof of membership, whatever address it is found at.
    context.check_hostname = False
    if ca is not None:
        _load_ca(context, ca)
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        _load_chain(context, cert, key)
    elif key is not None:
        raise ValueError("a client key was given without its certificate")
    return context


def _configure(context: ssl.SSLContext, ciphers: str | None, min_version: ssl.TLSVersion) -> None:
    context.minimum_version = min_version
    if ciphers is not None:
        try:
            context.set_ciphers(ciphers)
        except ssl.SSLError:
            raise ValueError(
                f"no cipher matches {ciphers!r} (OpenSSL cipher list syntax)"
            ) from None


def _is_pem(value: str) -> bool:
    return value.lstrip().startswith("-----BEGIN")


def _read_pem(value: str, what: str) -> tuple[str, str]:
    """The PEM text that ``value`` is or names, and how an error names it."""
    if _is_pem(value):
        return value, f"the {what} given as PEM text"
    name = f"{what} file {value!r}"
    try:
        data = Path(value).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{name} does not exist") from None
    except OSError as exc:
        raise ValueError(f"{name} cannot be read: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{name} is not PEM: it has no '-----BEGIN' line")
    return data.decode("ascii", "replace"), name


@contextlib.contextmanager
def _as_file(value: str) -> Iterator[str]:
    """A path to ``value``'s PEM: ``value`` itself if it is a path, else a temporary file
    holding the text (``load_cert_chain`` reads files only)."""
    if not _is_pem(value):
        yield value
        return
    # mkstemp makes the file readable by this user only: it may hold a private key.
    fd, path = tempfile.mkstemp(prefix="apportion-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(value)
        yield path
    finally:
        os.unlink(path)


def _load_ca(context: ssl.SSLContext, ca: str) -> None:
    text, name = _read_pem(ca, "CA")
    if "CERTIFICATE-----" not in text:
        raise ValueError(f"{name} holds no PEM certificate")
    try:
        context.load_verify_locations(cadata=text)
    except ssl.SSLError as exc:
        raise ValueError(f"{name} cannot be loaded: {tls_reason(exc)}") from None


class _EncryptedKey(Exception):
    """Raised by the password callback: OpenSSL asks for a password only for an
    encrypted key (and would ask on the terminal if there were no callback)."""


def _no_password() -> str:
    raise _EncryptedKey


def _load_chain(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    cert_text, cert_name = _read_pem(cert, "certificate")
    if "CERTIFICATE-----" not in cert_text:
        raise ValueError(f"{cert_name} holds no PEM certificate")
    key_text, key_name = (cert_text, cert_name) if key is None else _read_pem(key, "key")
    if "PRIVATE KEY-----" not in key_text:
        raise ValueError(f"{key_name} holds no PEM private key")
    with contextlib.ExitStack() as files:
        cert_path = files.enter_context(_as_file(cert))
        key_path = None if key is None else files.enter_context(_as_file(key))
        try:
            context.load_cert_chain(cert_path, key_path, password=_no_password)
        except _EncryptedKey:
            raise ValueError(f"{key_name} is encrypted: give the key unencrypted") from None
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise ValueError(f"{key_name} does not match {cert_name}") from None
            raise ValueError(f"{cert_name} cannot be loaded: {tls_reason(exc)}") from None


# --- a certificate for clusters without a CA -------------------------------------------

#: How long ``temporary_certificates`` are valid.
TEMPORARY_VALIDITY = datetime.timedelta(days=365)


def temporary_certificates() -> tuple[str, str]:
    """A new self-signed certificate and its private key, as PEM text.

    EC P-256, valid for a year, CN "apportion", for "localhost", 127.0.0.1 and ::1. It
    is its own CA (basicConstraints CA=True), so one pair serves every node of a
    cluster under mutual TLS: each shows it and trusts it. Needs ``cryptography``.
    """
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise ImportError(
            "Security.temporary() needs the cryptography package: pip install 'apportion[tls]'"
        ) from None
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "apportion")])
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # A little in the past: clocks of a cluster's machines are never quite equal.
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + TEMPORARY_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    return cert_pem, key_pem
