"""307 Temporary Redirect to the instance that owns a topic (Pulsar's admin REST does so).

The same method, path and query at the owner's advertised URL: a client re-sends the request
there, body and ``Authorization`` header included (307 keeps the method and the body).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from service.errors import NotOwner


def redirect_to_owner(request: Request, exc: NotOwner) -> JSONResponse:
    target = exc.url.rstrip("/") + request.url.path
    if request.url.query:
        target += "?" + request.url.query
    return JSONResponse({"reason": exc.reason}, status_code=307, headers={"Location": target})
