"""Authentication and authorization of requests: each route depends on ``require(rule)``.

With authentication off the dependency does nothing (the service behaves as it always has).
With it on, ``Authorization: Bearer <token>`` is checked (``service.tokens.TokenVerifier``)
and the role recorded on the request for the audit log; with authorization on, the role must
also satisfy the route's ``Rule`` on the tenant, namespace and topic its path names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request

from service.authorization import Authorizer, Rule
from service.errors import Unauthenticated
from service.tokens import TokenVerifier

_SCHEME = "bearer"


def authenticate(request: Request) -> str:
    """The role of the request's token; ``Unauthenticated`` (401) with the reason otherwise."""
    header = request.headers.get("authorization")
    if header is None:
        raise Unauthenticated("authentication required: send Authorization: Bearer <token>")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != _SCHEME or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    verifier: TokenVerifier = request.app.state.token_verifier
    role = verifier.role(token)
    request.state.role = role
    return role


def require(rule: Rule) -> Callable[[Request], Awaitable[None]]:
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
        params = request.path_params
        authorizer.check(
            role=role,
            rule=rule,
            tenant=params.get("tenant"),
            namespace=params.get("namespace"),
            topic=params.get("topic"),
        )

    check.rule = rule  # type: ignore[attr-defined]
    check.__name__ = f"require_{rule.name.lower()}"
    return check
