"""The OpenAPI document as the server behaves: which operations need a token, and every error they answer.

FastAPI derives the document from the routes' dependencies, which cannot tell that reads are open (the read
dependency accepts a token, checks it when given, and needs one only with ``TUNER_READ_REQUIRES_TOKEN``) nor
see the answers made outside the routes (413 by :mod:`tuner.api.limits`, 503 by :mod:`tuner.api.errors`, 400 for a
body that is not text). So the generated document is completed here, once per app:

* a read operation's security is optional (``[{}, {"HTTPBearer": []}]``) unless reads require a token;
* operations with a security requirement document 401 (and 403 when a scope can be missing);
* every operation with parameters or a body documents 422 in FastAPI's validation format, which every 422
  of this API uses (:mod:`tuner.api.errors`); POST operations document 400 and 413; operations that read or
  write the store document 503.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tuner.api.settings import ApiSettings

# Operations that never touch the store (no 503).
STORELESS = frozenset({"/v1/templates", "/v1/templates/{name}"})
_DETAIL = {"application/json": {"schema": {"$ref": "#/components/schemas/Detail"}}}
_VALIDATION = {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}
_ANSWERS: dict[str, tuple[str, dict[str, Any]]] = {
    "400": ("The body could not be read (not UTF-8 text)", _DETAIL),
    "401": ("No bearer token, or an unknown one", _DETAIL),
    "403": ("The token lacks the scope", _DETAIL),
    "413": ("Request body too large", _DETAIL),
    "422": ("Invalid input (field-level messages)", _VALIDATION),
    "503": ("The store is unreachable (retry later)", _DETAIL),
}


def install(app: FastAPI, settings: ApiSettings) -> None:
    """Replace ``app.openapi`` by the completed document (built on first use, then cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes, tags=app.openapi_tags)
            complete(schema, read_requires_token=settings.read_requires_token)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(schema: dict[str, Any], *, read_requires_token: bool) -> None:
    """Complete a generated document in place (see the module docstring)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault("Detail", {
        "type": "object", "required": ["detail"], "title": "Detail",
        "properties": {"detail": {"type": "string", "title": "Detail"}},
    })
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            codes = _codes(path, method, op, read_requires_token)
            responses = op.setdefault("responses", {})
            for code in codes:
                if code not in responses:
                    description, content = _ANSWERS[code]
                    responses[code] = {"description": description, "content": content}
                elif code == "422":
                    responses[code]["content"] = _VALIDATION
    if "HTTPValidationError" not in components:
        from fastapi.openapi.utils import validation_error_definition, validation_error_response_definition

        components["ValidationError"] = validation_error_definition
        components["HTTPValidationError"] = validation_error_response_definition


def _codes(path: str, method: str, op: dict[str, Any], read_requires_token: bool) -> list[str]:
    codes = []
    if op.get("security"):
        if method == "get" and not read_requires_token:
            op["security"] = [{}, *op["security"]]  # open: a token is checked only when one is given
            codes.append("401")
        else:
            codes += ["401", "403"]
    if op.get("parameters") or op.get("requestBody"):
        codes.append("422")
    if method == "post":
        codes += ["400", "413"]
    if path.startswith("/v1/") and path not in STORELESS:
        codes.append("503")
    return codes
