"""A person's credential as one token: ``person:NAME:SECRET``.

A person admitted by the cluster's owner (``apportion user add``) proves a secret of
their own, not the cluster's. Written as one token, it travels everywhere the
cluster's secret does today (``--token``, ``APPORTION_TOKEN``, ``--token-file``, a
scheduler file's ``token``), so no command needs a new option: the token says whom it
speaks for, the handshake sends that name and proves the secret part.

Pure: text in, text out.
"""

from __future__ import annotations

from apportion.core.people import OWNER, check_person_name

#: How a person's token begins; the cluster's secret never does (it is hex).
PREFIX = "person:"


def person_token(name: str, secret: str) -> str:
    """The token person ``name`` connects with."""
    return f"{PREFIX}{check_person_name(name)}:{secret}"


def split_token(token: str) -> tuple[str, str]:
    """``(person, secret)`` of a token: ``(OWNER, token)`` for the cluster's secret;
    ``ValueError`` for a person's token whose name is malformed."""
    if not token.startswith(PREFIX):
        return OWNER, token
    name, sep, secret = token[len(PREFIX) :].partition(":")
    if not sep:
        raise ValueError("a person's token reads person:NAME:SECRET")
    return check_person_name(name), secret
