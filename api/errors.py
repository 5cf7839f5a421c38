"""Domain errors to HTTP, in one place. Every error body is ``{"reason": "..."}``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import Conflict, InvalidInput, NotFound, ServiceError, TooLarge

STATUS: dict[type[ServiceError], int] = {
    InvalidInput: 400,
    NotFound: 404,
    Conflict: 409,
    TooLarge: 413,
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
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"reason": exc.reason}, status_code=_status(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        return JSONResponse({"reason": _describe(list(errors)), "detail": _jsonable(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"reason": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)


def _jsonable(errors: object) -> object:
    """Validation errors may carry raw input (bytes, exceptions); keep only what JSON can show."""
    if isinstance(errors, dict):
        return {k: _jsonable(v) for k, v in errors.items() if k != "ctx"}
    if isinstance(errors, list | tuple):
        return [_jsonable(v) for v in errors]
    if isinstance(errors, str | int | float | bool) or errors is None:
        return errors
    return repr(errors)
