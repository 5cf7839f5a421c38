"""Who a client is: Pulsar's chain of authentication providers, and its anonymous role.

``COMPACTOR_AUTHENTICATION_PROVIDERS`` names the providers (Pulsar's ``authenticationProviders``,
short names or the broker's Java class names):

- ``token``: a JWT (``service.tokens``), the role in its ``sub`` claim;
- ``basic``: ``user:password`` against an htpasswd file (``service.basic_auth``), the role the user;
- ``tls``: the client certificate the TLS handshake verified, the role its common name (CN).

Each edge builds ``Credentials`` (the method the client names, its data, the peer certificate)
and asks ``Authentication.role``. As Pulsar's ``ServerCnx`` dispatches: a method a configured
provider serves is checked by it (a failure is refused, never made anonymous); a method none
serves (no credentials at all, ``none``, or one this service does not have) gets the anonymous
role (``anonymousUserRole``) when one is set, and is refused otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from service.errors import Unauthenticated

if TYPE_CHECKING:
    from service.tokens import TokenVerifier

#: The providers, by the names an operator may give (broker.conf's class names carry over).
_JAVA = "org.apache.pulsar.broker.authentication.AuthenticationProvider"
PROVIDER_NAMES: Mapping[str, str] = {
    "token": "token",
    "basic": "basic",
    "tls": "tls",
    f"{_JAVA}Token": "token",
    f"{_JAVA}Basic": "basic",
    f"{_JAVA}Tls": "tls",
}
#: What a client that names no method sends (Pulsar's ``AuthenticationDisabled``).
NO_METHOD = "none"


def parse_providers(names: str | Iterable[str]) -> tuple[str, ...]:
    """The providers' short names, in order and once each, from a comma list or names;
    ``ValueError`` naming an unknown one."""
    items = names.split(",") if isinstance(names, str) else list(names)
    out: list[str] = []
    for item in items:
        name = item.strip()
        if not name:
            continue
        short = PROVIDER_NAMES.get(name) or PROVIDER_NAMES.get(name.lower())
        if short is None:
            raise ValueError(
                f"unknown authentication provider {name!r}: use token, basic or tls "
                f"(or Pulsar's {_JAVA}Token, ...Basic, ...Tls)"
            )
        if short not in out:
            out.append(short)
    return tuple(out)


@dataclass(frozen=True)
class Credentials:
    """What a client presented: the method it names (``token``, ``basic``, ``tls``, ``none``
    or another), the method's data (a token, ``user:password``), and the certificate its TLS
    handshake verified (``ssl.SSLObject.getpeercert()``'s dict, or None)."""

    method: str = NO_METHOD
    data: str = ""
    peer_certificate: Mapping[str, Any] | None = None

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"Credentials(method={self.method!r}, data=<{len(self.data)} chars>)"


class Provider(Protocol):
    """One authentication method: the role of credentials, or ``Unauthenticated``."""

    method: str

    def role(self, data: str) -> str: ...


class TokenProvider:
    """``token``: the role of a JWT (``TokenVerifier``)."""

    method = "token"

    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier = verifier

    def role(self, data: str) -> str:
        if not data:
            raise Unauthenticated("no token: send the token as the credentials of the token method")
        return self.verifier.role(data)


def common_name(certificate: Mapping[str, Any] | None) -> str | None:
    """The common name of a ``getpeercert()`` subject, as Pulsar's ``AuthenticationProviderTls``
    takes it: the first CN of the RFC 2253 form of the name, which lists the certificate's
    relative names last first. None without a certificate (``getpeercert()`` gives ``{}`` for
    one the handshake did not verify) or without a CN."""
    subject = (certificate or {}).get("subject") or ()
    for rdn in reversed(tuple(subject)):
        for attribute in rdn:
            if len(attribute) == 2 and attribute[0] == "commonName" and attribute[1]:
                return str(attribute[1])
    return None


class TlsProvider:
    """``tls``: the role is the common name of the client's verified certificate."""

    method = "tls"

    def role_of(self, certificate: Mapping[str, Any] | None) -> str:
        if not certificate:
            raise Unauthenticated(
                "Failed to get TLS certificates from client: connect with a client certificate"
            )
        name = common_name(certificate)
        if name is None:
            raise Unauthenticated("Client unable to authenticate with TLS certificate: it has no common name")
        return name


class Authentication:
    """The configured providers by method, and the anonymous role: who ``Credentials`` are."""

    def __init__(
        self,
        *,
        token: TokenVerifier | None = None,
        basic: Provider | None = None,
        tls: bool = False,
        anonymous_role: str | None = None,
    ) -> None:
        self._providers: dict[str, Provider] = {}
        if token is not None:
            self._providers["token"] = TokenProvider(token)
        if basic is not None:
            self._providers["basic"] = basic
        self._tls = TlsProvider() if tls else None
        self.anonymous_role = anonymous_role or None

    @property
    def methods(self) -> Sequence[str]:
        """The methods served, token first, then basic, then tls."""
        return tuple(m for m in ("token", "basic", "tls") if self.serves(m))

    def serves(self, method: str) -> bool:
        return method in self._providers or (method == "tls" and self._tls is not None)

    def role(self, credentials: Credentials) -> str:
        """The role of ``credentials``; ``Unauthenticated`` with the reason otherwise."""
        method = credentials.method
        if method == "tls" and self._tls is not None:
            return self._tls.role_of(credentials.peer_certificate)
        provider = self._providers.get(method)
        if provider is not None:
            return provider.role(credentials.data)
        if self.anonymous_role is not None:
            return self.anonymous_role
        if method == NO_METHOD:
            raise Unauthenticated(
                f"authentication required: no credentials, and no anonymous role "
                f"(this service takes {', '.join(self.methods)})"
            )
        raise Unauthenticated(
            f"No anonymous role, and no authentication provider configured for auth method {method!r} "
            f"(this service takes {', '.join(self.methods)})"
        )
