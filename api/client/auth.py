"""Authentication and TLS options, as pulsar-client-python names them."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable

from api.client.errors import ClientError


class AuthenticationToken:
    """A token to send with every request (``Authorization: Bearer``), as pulsar-client-python's.

    ``token`` is the token itself or a function returning it: the function is called once at
    first and again when the server answers 401 (the request is then retried once), so that a
    token that is renewed elsewhere (a file rewritten by an agent) is picked up.
    """

    def __init__(self, token: str | Callable[[], str]) -> None:
        if not callable(token) and not (isinstance(token, str) and token.strip()):
            raise ValueError("a token is a non-empty string or a function that returns one")
        self._supplier: Callable[[], str] | None = token if callable(token) else None
        self._token: str | None = None if callable(token) else token.strip()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "AuthenticationToken(<hidden>)"  # a token is a password: never in logs or reprs

    @property
    def renewable(self) -> bool:
        return self._supplier is not None

    def header(self) -> str:
        token = self._token
        if token is None:
            with self._lock:
                if self._token is None:
                    self._token = self._read()
                token = self._token
        return f"Bearer {token}"

    def renew(self) -> None:
        """Read the token again (after a 401)."""
        if self._supplier is not None:
            with self._lock:
                self._token = self._read()

    def _read(self) -> str:
        assert self._supplier is not None
        token = self._supplier()
        if not isinstance(token, str) or not token.strip():
            raise ClientError("the authentication token function returned no token")
        return token.strip()


def _tls_verify(trust_certs_file_path: str | None, allow_insecure: bool) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for pulsar-client-python's TLS options."""
    if allow_insecure:
        return False
    if trust_certs_file_path is not None:
        return ssl.create_default_context(cafile=trust_certs_file_path)
    return True
