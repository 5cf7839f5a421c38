"""HTTP basic authentication against an htpasswd file, as Pulsar's ``AuthenticationProviderBasic``.

The file (``COMPACTOR_BASIC_AUTH_CONF``, Pulsar's ``basicAuthConf`` / ``pulsar.auth.basic.conf``)
holds one ``user:hash`` a line. Pulsar checks exactly two hash formats, and so does this module:

- ``$apr1$salt$hash``: Apache's MD5 (``htpasswd -m``, ``openssl passwd -apr1``);
- a 13-character traditional DES ``crypt`` (``htpasswd -d``): only the password's first 8
  characters count, as everywhere DES crypt is computed.

Any other hash (bcrypt ``$2y$``, ``{SHA}``, a plain password) is one no password matches, in
Pulsar as here: the service starts and logs a warning naming the user. A line that is not
``user:hash`` is a settings error, as Pulsar refuses the whole file. Credentials are
``user:password`` (the binary protocol's auth data, or ``Authorization: Basic`` decoded): with
exactly one ``:``, so a password with a ``:`` is refused, as Pulsar refuses it.

The hashes are computed by libpass (passlib's maintained fork); Python's ``crypt`` is
deprecated and does not know ``$apr1$``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urlparse

from passlib.hash import apr_md5_crypt, des_crypt

from service.errors import Unauthenticated

log = logging.getLogger(__name__)

#: Pulsar's answer to an unknown user and to a wrong password alike (which one is not told).
REFUSED = "Unknown user or invalid password"
_DES = re.compile(r"^[./0-9A-Za-z]{13}$")
_APR1 = re.compile(r"^\$apr1\$[./0-9A-Za-z]{0,8}\$[./0-9A-Za-z]{22}$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/\s]*={0,2}\s*$")


def read_conf(value: str) -> bytes:
    """The bytes the setting names, in the forms Pulsar's ``readData`` takes, in its order:
    a ``data:`` URL (``data:;base64,...`` or URL-encoded text), a ``file:`` URL, the path of a
    file that exists, or the file's content in base64. ``ValueError`` with a reason otherwise."""
    value = value.strip()
    if value.startswith("data:"):
        head, sep, data = value.partition(",")
        if not sep:
            raise ValueError("a data: URL needs a ',' before its content (data:;base64,<base64>)")
        if head.endswith(";base64"):
            return _b64(data)
        return unquote_to_bytes(data)
    if value.startswith("file:"):
        path = Path(unquote(urlparse(value).path))
        try:
            return path.read_bytes()
        except OSError as e:
            raise ValueError(f"cannot read the basic auth file {path}: {e.strerror}") from None
    path = Path(value)
    if path.is_file():
        return path.read_bytes()
    if value and _BASE64.match(value):
        return _b64(value)
    raise ValueError(
        f"{value!r} is no file that exists, nor a file:// or data: URL, nor base64 "
        "(Pulsar's forms of pulsar.auth.basic.conf)"
    )


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the basic auth conf is not valid base64") from None


@dataclass(frozen=True)
class Entry:
    """One user of the file: the hash as written and how it is checked (None: no password matches)."""

    user: str
    hashed: str
    scheme: str | None


def parse(text: str, *, warn: bool = True) -> dict[str, Entry]:
    """The users of an htpasswd text; ``ValueError`` naming the line for one that is not
    ``user:hash`` (blank lines are skipped; a later line of a user replaces an earlier one).
    ``warn``: log each user whose hash no password matches."""
    users: dict[str, Entry] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(":")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"line {number} of the basic auth conf is not user:hash")
        user, hashed = parts
        scheme = _scheme(hashed)
        if scheme is None and warn:
            log.warning(
                "basic auth: user %r has a hash no password matches: use crypt (htpasswd -d) or "
                "$apr1$ (htpasswd -m), the formats Pulsar's AuthenticationProviderBasic checks",
                user,
            )
        users[user] = Entry(user, hashed, scheme)
    return users


def _scheme(hashed: str) -> str | None:
    if hashed.startswith("$apr1"):
        return "apr1" if _APR1.match(hashed) else None
    return "des" if _DES.match(hashed) else None


def load(value: str, *, warn: bool = True) -> dict[str, Entry]:
    """The users of the file the setting names (``ValueError`` with a reason)."""
    data = read_conf(value)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the basic auth conf is not UTF-8 text") from None
    return parse(text, warn=warn)


def split_credentials(data: str) -> tuple[str, str]:
    """``user:password`` as Pulsar splits it; ``Unauthenticated`` unless exactly one ``:``
    with a password after it."""
    parts = data.split(":")
    if len(parts) != 2 or not parts[1]:
        raise Unauthenticated("Base64 decoded params are invalid: send user:password")
    return parts[0], parts[1]


def decode_header(value: str) -> str:
    """The ``user:password`` of an ``Authorization: Basic <base64>`` header's credentials."""
    try:
        return base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        raise Unauthenticated("Base64 decoding is failure: send Basic <base64 of user:password>") from None


class BasicAuthenticator:
    """Checks ``user:password`` against the users of an htpasswd file; the role is the user.

    Verified credentials are remembered by a keyed digest (never the password), up to
    ``cache_size``: a REST client sends them with every request, and a hash costs about half
    a millisecond of the event loop.
    """

    method = "basic"

    def __init__(self, users: dict[str, Entry], *, cache_size: int = 10_000) -> None:
        self.users = users
        self.cache_size = cache_size
        self._key = os.urandom(32)
        self._verified: dict[bytes, str] = {}

    @classmethod
    def from_conf(cls, value: str, *, cache_size: int = 10_000) -> BasicAuthenticator:
        return cls(load(value), cache_size=cache_size)

    def role(self, data: str) -> str:
        """The user of valid ``user:password`` credentials; ``Unauthenticated`` otherwise."""
        user, password = split_credentials(data)
        digest = hmac.new(self._key, data.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()
        if self._verified.get(digest) == user:
            return user
        if not self._matches(user, password):
            raise Unauthenticated(REFUSED)
        if self.cache_size:
            if len(self._verified) >= self.cache_size:
                self._verified.clear()
            self._verified[digest] = user
        return user

    def _matches(self, user: str, password: str) -> bool:
        entry = self.users.get(user)
        if entry is None or entry.scheme is None:
            return False
        try:
            if entry.scheme == "apr1":
                return bool(apr_md5_crypt.verify(password, entry.hashed))
            return bool(des_crypt.verify(password, entry.hashed))
        except (ValueError, TypeError):  # a password DES crypt cannot take (a NUL byte)
            return False
