"""The command line's side of the HTTP API (``tuner submit``, ``jobs``, ``status``, ``cancel``): requests and
their errors as one-line messages.

Server URL: ``--url``, else ``$TUNER_URL``, else ``http://127.0.0.1:8000``. Token: ``--token``, else
``$TUNER_TOKEN``, else the token file ``tuner serve`` writes when no ``TUNER_TOKENS`` is configured
(:func:`local_token_path`). Prefer the environment to ``--token``: command lines are visible to other users.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from tuner.errors import TunerError, UserInputError

DEFAULT_URL = "http://127.0.0.1:8000"


class RemoteInputError(UserInputError):
    """The server refused the request (4xx) or cannot be reached; the CLI exits with code 2."""


class RemoteError(TunerError):
    """The server failed (5xx, e.g. 503 while its store is down); the CLI exits with code 1."""


def local_token_path() -> Path:
    """``token`` in :func:`tuner.settings.data_home` (beside the default SQLite store)."""
    from tuner.settings import data_home

    return data_home() / "token"


def local_token(*, create: bool) -> str | None:
    """The local token (owner-only file), created with a random value when ``create`` and absent."""
    path = local_token_path()
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def resolve_url(url: str | None) -> str:
    return (url or os.environ.get("TUNER_URL") or DEFAULT_URL).rstrip("/")


def resolve_token(token: str | None) -> str | None:
    return token or os.environ.get("TUNER_TOKEN") or local_token(create=False)


def call(method: str, path: str, *, url: str | None, token: str | None, json: Any = None,
         params: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
    """One API request; the decoded JSON body. Raises RemoteInputError (4xx, unreachable), RemoteError (5xx)."""
    import httpx

    from tuner.service.client import error_message

    base = resolve_url(url)
    token = resolve_token(token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=base, timeout=timeout_s, headers=headers) as client:
            response = client.request(method, path, json=json, params=params)
    except httpx.HTTPError as exc:
        raise RemoteInputError(f"cannot reach the tuner server at {base}: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        message = f"{response.status_code}: {error_message(response)}"
        raise (RemoteInputError if response.status_code < 500 else RemoteError)(message)
    return response.json()
