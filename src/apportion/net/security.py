"""What a process proves and checks on every connection: the cluster's secret and, when
asked for, TLS. ``Security`` takes Dask's names, so a Dask user's ``Security(...)``
carries over; ``token`` is ours.

Where the secret comes from when none is given (``from_environment``):

1. ``APPORTION_TOKEN`` (the secret itself), else ``APPORTION_TOKEN_FILE`` (a file
   holding it, private to its owner);
2. else the user's own secret, ``$APPORTION_HOME/secret``, which ``apportion
   scheduler`` creates on first use. Every process of one account finds the same
   secret there, so a scheduler, its workers and clients on one machine (or on a
   shared file system) need no flag at all.

``Client()`` and ``LocalCluster`` need none of this: they make a secret in memory
and hand it to the workers they start.
"""

from __future__ import annotations

import os
import secrets
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from apportion.home import home_dir, read_private, write_private
from apportion.net import auth
from apportion.net.address import host_part, is_inproc, is_loopback
from apportion.net.person_token import split_token

#: The variable holding the secret itself, and the one naming a file that holds it.
TOKEN_ENV = "APPORTION_TOKEN"
TOKEN_FILE_ENV = "APPORTION_TOKEN_FILE"
#: Certificate, key and CA of this process (paths or PEM text), for every role.
TLS_CERT_ENV = "APPORTION_TLS_CERT"
TLS_KEY_ENV = "APPORTION_TLS_KEY"
TLS_CA_ENV = "APPORTION_TLS_CA"
#: The user's own secret, in ``$APPORTION_HOME``.
SECRET_FILE = "secret"

#: How to get a secret, said wherever one is missing or wrong.
HOW_TO_GIVE = (
    "give the cluster's secret with --token, APPORTION_TOKEN, APPORTION_TOKEN_FILE or "
    "a scheduler file (`apportion token` prints this account's)"
)


class AuthenticationError(Exception):
    """This process and its peer do not share a secret. Final: trying again would fail
    again, so it is not an ``OSError`` that reconnection loops retry."""


class MissingSecretError(AuthenticationError):
    """This process has no secret to prove itself with."""


def new_token() -> str:
    """A fresh secret: 256 random bits as text."""
    return secrets.token_hex(32)


def secret_path() -> Path:
    """The user's own secret: ``$APPORTION_HOME/secret`` (``PrivateFileError`` if that
    home is not the user's own)."""
    return home_dir() / SECRET_FILE


def user_secret(*, create: bool) -> str | None:
    """The user's own secret; made first if ``create`` and there is none yet."""
    path = secret_path()  # refuses another user's home, or one others may write to
    try:
        found = path.exists()
    except PermissionError:
        # A home we may not search: read_private says so in a line naming the file,
        # rather than a stat's bare PermissionError.
        found = True
    if not found:
        if not create:
            return None
        write_private(path, new_token() + "\n")
    return read_private(path, "secret file").strip()


def read_token_file(path: str | Path) -> str:
    """The secret held in the file at ``path`` (private to its owner)."""
    return read_private(Path(path), "token file").strip()


#: The roles that hold certificates of their own, as Dask names them.
ROLES = ("client", "scheduler", "worker")


@dataclass(frozen=True)
class Security:
    """The credentials of one process: the cluster's ``token`` and, optionally, TLS.

    TLS fields are paths to PEM files or PEM text, as in Dask. With a
    ``tls_ca_file``, TLS is mutual: each side must show a certificate signed by
    that CA. ``require_encryption`` refuses any address that is not ``tls://``.
    """

    require_encryption: bool = False
    tls_ca_file: str | None = None
    tls_ciphers: str | None = None
    tls_min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    tls_client_cert: str | None = None
    tls_client_key: str | None = None
    tls_scheduler_cert: str | None = None
    tls_scheduler_key: str | None = None
    tls_worker_cert: str | None = None
    tls_worker_key: str | None = None
    #: The cluster's secret (None: this process has none and cannot connect).
    token: str | None = field(default=None, repr=False)
    #: Where ``token`` came from, for error messages ("APPORTION_TOKEN", a path, ...).
    token_source: str = "this process"
    _contexts: dict[tuple[str, str], ssl.SSLContext] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def temporary(cls, **kwargs: Any) -> Security:
        """Mutual TLS with a fresh self-signed certificate for every role, and a fresh
        secret: for a cluster whose processes are all started from here."""
        from apportion.net.certificates import temporary_certificates

        cert, key = temporary_certificates()
        pem: dict[str, Any] = {"tls_ca_file": cert}
        for role in ROLES:
            pem[f"tls_{role}_cert"] = cert
            pem[f"tls_{role}_key"] = key
        options = {"require_encryption": True, **pem, "token": new_token(), **kwargs}
        options.setdefault("token_source", "Security.temporary()")
        return cls(**options)

    @classmethod
    def in_memory(cls) -> Security:
        """A fresh secret known to this process only (``Client()``, ``LocalCluster``)."""
        return cls(token=new_token(), token_source="this cluster")

    @classmethod
    def of_this_process(cls) -> Security:
        """One secret for every in-memory scheduler of this process: only this process
        can reach them, and a scheduler restarted at the same ``inproc://`` address
        takes back its workers, as one restarted on a port with the user's secret does."""
        global _PROCESS
        if _PROCESS is None:
            _PROCESS = cls(token=new_token(), token_source="this process")
        return _PROCESS

    @classmethod
    def from_environment(cls, *, create: bool = False) -> Security:
        """The secret found as the module docstring says (``create``: make the user's
        own if there is none), and the certificate, key and CA named by
        ``APPORTION_TLS_CERT``, ``APPORTION_TLS_KEY`` and ``APPORTION_TLS_CA`` (paths or
        PEM text; the command line's ``--tls-*`` options set them), used for every role."""
        token, source = find_token(create=create)
        cert, key = os.environ.get(TLS_CERT_ENV) or None, os.environ.get(TLS_KEY_ENV) or None
        tls: dict[str, Any] = {"tls_ca_file": os.environ.get(TLS_CA_ENV) or None}
        for role in ROLES:
            tls[f"tls_{role}_cert"], tls[f"tls_{role}_key"] = cert, key
        return cls(token=token, token_source=source, **tls)

    def with_token(self, token: str | None, source: str) -> Security:
        """These TLS settings with another secret (``None``: keep this one)."""
        if token is None:
            return self
        return replace(self, token=token, token_source=source, _contexts={})

    def environment(self, role: str = "worker") -> dict[str, str]:
        """The variables that give a process started from here these credentials as
        ``role`` (``from_environment`` reads them): never its command line, which every
        user of the machine can read."""
        env = {TOKEN_ENV: self.token} if self.token else {}
        cert, key = self.cert_for(role)
        files = {TLS_CERT_ENV: cert, TLS_KEY_ENV: key, TLS_CA_ENV: self.tls_ca_file}
        for name, value in files.items():
            if value:
                env[name] = value
        return env

    # --- the secret ------------------------------------------------------------------

    def key(self) -> bytes:
        """The secret as the key of every proof; ``MissingSecretError`` if there is none.
        A person's token (``net/person_token.py``) proves its secret part."""
        if self.token is None:
            raise MissingSecretError(f"no secret to connect with: {HOW_TO_GIVE}")
        return auth.check_secret(self._split()[1], self.token_source)

    @property
    def person(self) -> str:
        """Whom this token speaks for: a person's name, or ``OWNER`` ("") for the
        cluster's secret (and for no secret at all)."""
        return "" if self.token is None else self._split()[0]

    def _split(self) -> tuple[str, str]:
        assert self.token is not None
        try:
            return split_token(self.token)
        except ValueError as exc:
            raise auth.WeakSecretError(f"the token from {self.token_source}: {exc}") from None

    # --- TLS -------------------------------------------------------------------------

    def cert_for(self, role: str) -> tuple[str | None, str | None]:
        """The certificate and key of ``role``; a role without its own borrows the
        client's (Dask's workers connect with the worker's)."""
        cert = getattr(self, f"tls_{role}_cert", None) or self.tls_client_cert
        key = getattr(self, f"tls_{role}_key", None) or self.tls_client_key
        return cert, key

    def listen_context(self, role: str) -> ssl.SSLContext:
        """The TLS context of a ``role`` listening (the scheduler, a worker's data port)."""
        from apportion.net.certificates import server_context

        cert, key = self.cert_for(role)
        if cert is None or key is None:
            raise ValueError(
                f"a {role} listening on tls:// needs a certificate and its key "
                f"(tls_{role}_cert and tls_{role}_key; --tls-cert and --tls-key)"
            )
        return self._context("listen", role, partial(server_context, cert, key))

    def connect_context(self, role: str) -> ssl.SSLContext:
        """The TLS context of a ``role`` connecting to a ``tls://`` address."""
        from apportion.net.certificates import client_context

        cert, key = self.cert_for(role)
        return self._context("connect", role, lambda ca, **kw: client_context(ca, cert, key, **kw))

    def _context(self, side: str, role: str, make: Callable[..., ssl.SSLContext]) -> ssl.SSLContext:
        """``make(ca, ciphers=, min_version=)``, once per side and role: files are read
        once, not on every connection."""
        cached = self._contexts.get((side, role))
        if cached is None:
            cached = make(
                self.tls_ca_file, ciphers=self.tls_ciphers, min_version=self.tls_min_version
            )
            self._contexts[side, role] = cached
        return cached

    @property
    def has_tls(self) -> bool:
        """Whether any certificate is configured."""
        return any(self.cert_for(role)[0] for role in ROLES)


class PlaintextRefused(ValueError):
    """A listener asked to take connections from the network without TLS."""


def check_exposure(host: str, security: Security, *, allow_plaintext: bool) -> None:
    """Refuse to listen on a non-loopback ``host`` without TLS unless ``allow_plaintext``:
    the secret keeps strangers from running code, but not from reading the data that
    crosses the network, nor from taking over a connection."""
    if allow_plaintext or is_inproc(host) or is_loopback(host_part(host)) or security.has_tls:
        return
    raise PlaintextRefused(
        f"refusing to listen on {host} without TLS: give a certificate and key (--tls-cert "
        "and --tls-key, or a Security; docs/security.md shows how to make them), or allow "
        "it (--allow-plaintext, allow_plaintext=True)"
    )


def find_token(*, create: bool) -> tuple[str | None, str]:
    """The secret and where it was found, as the module docstring says."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token.strip(), TOKEN_ENV
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        return read_token_file(path), path
    return user_secret(create=create), str(secret_path())


_PROCESS: Security | None = None

#: The credentials of each listener of this process, by address: a client or worker
#: of this same process connecting there needs no other (``Client(cluster)`` with an
#: in-process cluster, the in-memory test cluster). Nothing here leaves the process.
_LISTENING: dict[str, Security] = {}


def listening(address: str, security: Security) -> None:
    """Remember that this process listens at ``address`` with ``security``."""
    _LISTENING[address] = security


def stopped_listening(address: str) -> None:
    _LISTENING.pop(address, None)


def security_for(address: str, given: Security | None = None) -> Security:
    """The credentials to connect to ``address`` with: ``given``; else those of this
    process's own listener there; else those of the environment (module docstring)."""
    if given is not None:
        return given
    own = _LISTENING.get(address)
    if own is not None:
        return own
    return Security.from_environment()
