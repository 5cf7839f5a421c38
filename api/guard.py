"""Checks every request passes before routing, as a plain ASGI middleware.

(Starlette's ``@app.middleware("http")`` would do, but it streams every response through an
extra task and memory stream; a page of a thousand messages pays for that on each read.)
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class RequestGuard:
    """Refuses, with a 4xx and a JSON reason, what routing must never see:

    - an encoded slash in the path: routing sees the decoded path, so ``a%2Fb`` would reach a
      route as two segments and could even name a different resource;
    - a ``Content-Length`` that is not a number, or over ``max_request_bytes`` (413).
    """

    def __init__(self, app: ASGIApp, *, max_request_bytes: int) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                status, reason = refusal
                # The same body as every other refusal (api/errors.py).
                await JSONResponse({"reason": reason}, status_code=status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        if b"%2f" in scope.get("raw_path", b"").lower():
            return 400, "invalid name: '/' is not allowed in a name part"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    return 400, "invalid Content-Length"
                if int(value) > self.max_request_bytes:
                    return 413, f"request body over {self.max_request_bytes} bytes"
        return None
