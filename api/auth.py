"""Authentication and authorization of requests: each route depends on ``require(rule)``.

With authentication off the dependency does nothing (the service behaves as it always has).
With it on, the request's credentials go to the provider chain (``service.authentication``) and
the role is recorded on the request for the audit log; with authorization on, the role must
also satisfy the route's ``Rule`` on the tenant, namespace and topic its path names.

The method is chosen as Pulsar's web service chooses it: the ``X-Pulsar-Auth-Method-Name``
header when the client sends one (Pulsar's Java client does), else the ``Authorization``
scheme (``Bearer`` the token provider, ``Basic`` the basic one), else the client certificate of
the TLS connection (the tls provider), else none (the anonymous role, if there is one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request

from api.tls import peer_certificate_of
from service.authentication import NO_METHOD, Authentication, Credentials
from service.authorization import Authorizer, Rule
from service.basic_auth import decode_header
from service.errors import Unauthenticated

#: The header Pulsar's clients name their method in (``AuthenticationFilter.PULSAR_AUTH_METHOD_NAME``).
METHOD_HEADER = "x-pulsar-auth-method-name"
_SCHEMES = {"bearer": "token", "basic": "basic"}
_FORMS = {"token": "'Bearer <token>'", "basic": "'Basic <base64 of user:password>'"}
_HOW = {
    "token": "Authorization: Bearer <token>",
    "basic": "Authorization: Basic <base64 of user:password>",
    "tls": "a client certificate",
}


def credentials(request: Request, chain: Authentication) -> Credentials:
    """What the request presents, with the method it names (see the module's note); the data
    of a method ``chain`` serves is checked for its form here, where the header is known."""
    cert = peer_certificate_of(request)
    header = request.headers.get("authorization")
    scheme, data = "", ""
    if header is not None:
        scheme, _, data = header.strip().partition(" ")
        scheme, data = scheme.lower(), data.strip()
    method = request.headers.get(METHOD_HEADER, "").strip()
    if not method:
        if header is not None:
            method = _SCHEMES.get(scheme, scheme or NO_METHOD)
        else:
            method = "tls" if cert else NO_METHOD
    if chain.serves(method):  # else the anonymous role, or refused, whatever the data
        data = _method_data(method, scheme, data)
    return Credentials(method=method, data=data, peer_certificate=cert)


def _method_data(method: str, scheme: str, data: str) -> str:
    """The data the provider of ``method`` checks, from the header's credentials."""
    if method == "token" and (scheme != "bearer" or not data):
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    if method == "basic":
        if scheme != "basic" or not data:
            raise Unauthenticated("the Authorization header must be 'Basic <base64 of user:password>'")
        return decode_header(data)
    return data


def authenticate(request: Request) -> str:
    """The role of the request's credentials; ``Unauthenticated`` (401) with the reason otherwise."""
    chain: Authentication = request.app.state.authentication
    creds = credentials(request, chain)
    if (
        chain.anonymous_role is None
        and not chain.serves(creds.method)
        and METHOD_HEADER not in request.headers
    ):
        # REST's own words for what to send (a method named in Pulsar's header gets Pulsar's
        # reason from the chain, as the wire does).
        forms = " or ".join(_FORMS[m] for m in chain.methods if m in _FORMS)
        if "authorization" in request.headers and forms:
            raise Unauthenticated(f"the Authorization header must be {forms}")
        ways = " or ".join(_HOW[m] for m in chain.methods)
        raise Unauthenticated(f"authentication required: send {ways}")
    role = chain.role(creds)
    request.state.role = role
    return role


#: Where a route's path names its resource other than by ``tenant``, ``namespace`` and ``topic``
#: parameters (the table catalog's ``tenant%1Fnamespace``): those three, or None for a path
#: that names none (the route answers 404 then; the request is still authenticated).
Resource = Callable[[Request], tuple[str | None, str | None, str | None] | None]


def _path_resource(request: Request) -> tuple[str | None, str | None, str | None]:
    params = request.path_params
    return params.get("tenant"), params.get("namespace"), params.get("topic")


def require(rule: Rule, resource: Resource = _path_resource) -> Callable[[Request], Awaitable[None]]:
    """The dependency a route declares for its rule (``rule`` is kept on it, so a test can
    find every route's rule and fail on a route that has none)."""

    async def check(request: Request) -> None:
        state = request.app.state
        if not state.settings.authentication_enabled:
            return
        role = authenticate(request)
        authorizer: Authorizer | None = state.authorizer
        if authorizer is None:
            return
        named = resource(request)
        if named is None:
            return
        tenant, namespace, topic = named
        authorizer.check(role=role, rule=rule, tenant=tenant, namespace=namespace, topic=topic)

    check.rule = rule  # type: ignore[attr-defined]
    check.__name__ = f"require_{rule.name.lower()}"
    return check
