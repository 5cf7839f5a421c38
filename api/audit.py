"""The audit log: one line for every admin change (role, action, resource, outcome).

A plain ASGI middleware, as ``api.guard``: it sees every request, so a refused change (401,
403) is logged as well as a done one, and it runs after routing has named the endpoint.
The token itself is never logged, only the role it proved.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("compactor.audit")

_CHANGES = frozenset({"PUT", "POST", "DELETE"})


class AuditLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in _CHANGES
            or not scope["path"].startswith("/admin/")
        ):
            await self.app(scope, receive, send)
            return
        logged = False

        def audit(status: int) -> None:
            nonlocal logged
            logged = True
            state = scope.get("state") or {}
            endpoint = scope.get("endpoint")
            log.info(
                "role=%s action=%s resource=%s outcome=%s",
                state.get("role", "-"),
                getattr(endpoint, "__name__", scope["method"]),
                scope["path"],
                _outcome(status),
            )

        async def send_audited(message: Message) -> None:
            # Written before the reply leaves: a client that has its answer finds the line.
            if message["type"] == "http.response.start":
                audit(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_audited)
        finally:
            if not logged:  # failed before any reply
                audit(500)


def _outcome(status: int) -> str:
    if status < 400:
        return "success"
    if status == 401:
        return "unauthenticated"
    if status == 403:
        return "denied"
    return f"failed-{status}"
