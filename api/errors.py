"""Domain errors → HTTP responses, translated once here (routes raise tuner errors, never HTTPException).

| error                                        | status | body                                              |
|----------------------------------------------|--------|---------------------------------------------------|
| :class:`FieldError`                          | its own| ``{"detail": [{"loc": [...], "msg": ..., "type": ...}]}`` |
| UnknownTemplateError, NotFoundError          | 404    | ``{"detail": "<message>"}``                       |
| RecordConflictError                          | 409    | ``{"detail": "<message>"}``                       |
| other UserInputError (shape, config, space…, | 422    | ``{"detail": [{"loc": [], "msg": …, "type": …}]}``  |
| RecordRejectedError: refused by the database)|        |                                                   |
| StoreError (database unreachable, refusing)  | 503    | ``{"detail": "store unavailable: <masked URL and cause>"}`` |

Field-level errors use FastAPI's own validation format, so clients parse one shape of error. Messages come
from our errors, which never carry tokens; StoreError messages carry the URL with its password masked.
A value the database refuses as data (RecordRejectedError: out of range, NUL…) is the caller's input: 422.

Every error body is rendered by :class:`ErrorResponse`, which cannot fail: a request's echoed input may hold
``NaN`` or a lone surrogate, which plain JSON rendering refuses (a 500, and uvicorn then drops the
connection); here such values are written as text.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tuner.errors import (
    NotFoundError,
    RecordConflictError,
    StoreError,
    TunerError,
    UnknownTemplateError,
    UserInputError,
)

log = logging.getLogger(__name__)


class FieldError(UserInputError):
    """A user error located in the request (``loc`` as in FastAPI's validation errors), with its status."""

    def __init__(
        self, message: str, loc: Sequence[str | int], *, status: int = 422, kind: str = "value_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.loc, self.status, self.kind, self.headers = tuple(loc), status, kind, headers

    @classmethod
    def wrap(cls, exc: UserInputError, loc: Sequence[str | int]) -> FieldError:
        """Locate a domain error (unknown templates stay 404)."""
        status = 404 if isinstance(exc, UnknownTemplateError) else 422
        return cls(str(exc), loc, status=status, kind=_kind(exc))


def _kind(exc: BaseException) -> str:
    # ShapeError → shape_error, UnknownWorkloadError → unknown_workload_error …
    name = type(exc).__name__.removesuffix("Error")
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return f"{snake}_error"


def printable(value: Any) -> Any:
    """``value`` as JSON can hold it: non-finite floats and other objects as text, lone surrogates escaped."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {printable(str(k)): printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable(v) for v in value]
    return printable(str(value))


class ErrorResponse(JSONResponse):
    """A JSON response whose rendering never raises (see the module docstring)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(printable(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _detail(status: int, detail: object, headers: dict[str, str] | None = None) -> JSONResponse:
    return ErrorResponse({"detail": detail}, status_code=status, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {k: e[k] for k in ("type", "loc", "msg", "input", "ctx") if k in e}
        for e in exc.errors()
    ]
    return _detail(422, errors)


async def _field_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    return _detail(exc.status, [{"loc": list(exc.loc), "msg": str(exc), "type": exc.kind}], exc.headers)


async def _store_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    return _detail(503, f"store unavailable: {exc}", {"Retry-After": "5"})


def status_of(exc: Exception) -> int:
    """The HTTP status of a domain error (TunerError): 404, 409, 422, else 500; the pages use the same."""
    if isinstance(exc, (UnknownTemplateError, NotFoundError)):
        return 404
    if isinstance(exc, RecordConflictError):
        return 409
    if isinstance(exc, UserInputError):
        return 422
    return 500


async def _tuner_error(request: Request, exc: Exception) -> JSONResponse:
    status = status_of(exc)
    if status == 500:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    if status == 422:  # every 422 in FastAPI's validation format (an error not tied to a field: loc [])
        return _detail(422, [{"loc": [], "msg": str(exc), "type": _kind(exc)}])
    return _detail(status, str(exc))


# The domain errors with a handler (each answered by :func:`status_of`); the pages wrap each (api.ui.errors).
DOMAIN_ERRORS = (UnknownTemplateError, NotFoundError, RecordConflictError, UserInputError, TunerError)


def install(app: FastAPI) -> None:
    """Register the translations (Starlette picks the handler of the nearest class in the MRO)."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(FieldError, _field_error)
    app.add_exception_handler(StoreError, _store_error)
    for cls in DOMAIN_ERRORS:
        app.add_exception_handler(cls, _tuner_error)
