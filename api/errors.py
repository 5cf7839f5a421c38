"""Domain errors to HTTP, in one place. Every error body is ``{"reason": "..."}``.

``DamagedData`` (a stored file failed a checksum) is a 500 whose reason names the topic, the
ledger and the check. ``NotOwner`` (several instances: another one owns the topic) is a 307 to
it (``api.redirects``). ``Unavailable`` (a full seal backlog, descriptors exhausted, a damaged
compacted ledger being rebuilt, a lease lost) is 503 with ``Retry-After``. An ``OSError`` that
is the process running out of descriptors, wherever it is raised, becomes the same 503 (and is
noted for ``/health``); one that is object storage not answering is a 503 too
(``StorageUnavailable``); any other ``OSError`` stays a 500, as a bug should.

Under ``/iceberg`` (the table catalog) every error is in Iceberg's shape as well
(``api.iceberg_schemas.iceberg_error``), and a request of the wrong shape is its 400
``BadRequestException`` (the protocol has no 422).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.iceberg_schemas import iceberg_error
from api.redirects import redirect_to_owner
from ledger.storage import is_unavailable
from service.errors import (
    Conflict,
    DamagedData,
    Forbidden,
    InvalidInput,
    NoSuchNamespace,
    NoSuchTable,
    NotAllowed,
    NotFound,
    NotOwner,
    ServiceError,
    StorageUnavailable,
    TooLarge,
    Unauthenticated,
    Unavailable,
    is_descriptor_exhaustion,
)

STATUS: dict[type[ServiceError], int] = {
    InvalidInput: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    NotAllowed: 405,
    Conflict: 409,
    TooLarge: 413,
    # Damage is not the client's doing: a 500, but always with a reason (never a bare one).
    DamagedData: 500,
    Unavailable: 503,
}


def _status(exc: ServiceError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def _describe(errors: list[dict]) -> str:  # type: ignore[type-arg]
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return "; ".join(parts) or "invalid request"


def install(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        response = _error_response(exc, challenge=_challenge(request), iceberg=_iceberg(request))
        if response.status_code == 405:
            # RFC 9110: a 405 names what the path does allow (none, for a path only refused).
            response.headers["Allow"] = ", ".join(_allowed(request))
        return response

    @app.exception_handler(NotOwner)
    async def _not_owner(request: Request, exc: NotOwner) -> JSONResponse:
        return redirect_to_owner(request, exc)

    @app.exception_handler(OSError)
    async def _os_error(request: Request, exc: OSError) -> JSONResponse:
        if is_unavailable(exc):  # object storage does not answer: retry once it does
            first = str(exc).strip().splitlines()[0][:300]
            unavailable = StorageUnavailable(f"the ledger storage does not answer: {first}")
            return _error_response(unavailable, iceberg=_iceberg(request))
        if not is_descriptor_exhaustion(exc):
            raise exc  # a 500: not the client's doing, nor a resource to wait for
        broker = getattr(request.app.state, "broker", None)
        where = f"{request.method} {request.url.path}"
        if broker is None:
            return _error_response(Unavailable(f"the service ran out of file descriptors ({where})"))
        return _error_response(broker.resources.exhaustion.note(where, exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if _iceberg(request):
            return JSONResponse(iceberg_error(400, _describe(list(errors))), status_code=400)
        return JSONResponse({"reason": _describe(list(errors)), "detail": _jsonable(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:
            # Starlette names the methods of the first route that matched the path; a path
            # served by several routes (PUT and DELETE of a topic) allows all of theirs.
            headers = {**(headers or {}), "Allow": ", ".join(_allowed(request))}
        if _iceberg(request):
            body = iceberg_error(exc.status_code, str(exc.detail))
            return JSONResponse(body, status_code=exc.status_code, headers=headers)
        return JSONResponse({"reason": str(exc.detail)}, status_code=exc.status_code, headers=headers)


def _iceberg(request: Request) -> bool:
    """Whether the request is the table catalog's (its errors in Iceberg's shape)."""
    return request.url.path.startswith("/iceberg/")


#: Iceberg's exception types of the catalog's own errors (the rest: by status).
_ICEBERG_TYPES: dict[type[ServiceError], str] = {
    NoSuchNamespace: "NoSuchNamespaceException",
    NoSuchTable: "NoSuchTableException",
}


def _allowed(request: Request) -> list[str]:
    """The methods of the routes the path is documented under: where templates of different
    specificity match it (Pulsar's ``.../{namespace}/partitioned`` beside ``.../{topic}``),
    those with the fewest parameters, as the OpenAPI document lists it."""
    matched: list[tuple[int, set[str]]] = []
    for route in iter_route_contexts(request.app.routes):
        regex = getattr(route, "path_regex", None)
        if getattr(route, "include_in_schema", False) and regex is not None and regex.match(request.url.path):
            matched.append((getattr(route, "path", "").count("{"), set(route.methods or ())))
    if not matched:
        return []
    fewest = min(n for n, _ in matched)
    return sorted(set().union(*(m for n, m in matched if n == fewest)))


def _challenge(request: Request) -> str:
    """The schemes a 401 names (RFC 7235): those of the providers served, the token's first."""
    chain = getattr(request.app.state, "authentication", None)
    methods = chain.methods if chain is not None else ("token",)
    schemes = [_SCHEMES[m] for m in methods if m in _SCHEMES] or ["Bearer"]
    return ", ".join(f'{scheme} realm="compactor"' for scheme in schemes)


_SCHEMES = {"token": "Bearer", "basic": "Basic"}


def _error_response(
    exc: ServiceError, *, challenge: str = 'Bearer realm="compactor"', iceberg: bool = False
) -> JSONResponse:
    status = _status(exc)
    headers: dict[str, str] | None = None
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(exc.retry_after)}
    elif status == 401:
        # RFC 6750 / 7235: a 401 names the schemes the client may use.
        headers = {"WWW-Authenticate": challenge}
    if iceberg:
        body = iceberg_error(status, exc.reason, _ICEBERG_TYPES.get(type(exc)))
        return JSONResponse(body, status_code=status, headers=headers)
    return JSONResponse({"reason": exc.reason}, status_code=status, headers=headers)


def _jsonable(errors: object) -> object:
    """Validation errors may carry raw input (bytes, exceptions); keep only what JSON can show."""
    if isinstance(errors, dict):
        return {k: _jsonable(v) for k, v in errors.items() if k != "ctx"}
    if isinstance(errors, list | tuple):
        return [_jsonable(v) for v in errors]
    if isinstance(errors, str):
        # Input JSON can escape a lone surrogate, which no UTF-8 response can carry as it is.
        return errors.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(errors, int | float | bool) or errors is None:
        return errors
    return repr(errors)
