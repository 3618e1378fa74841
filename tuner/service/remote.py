"""The command line's side of the HTTP API (``tuner submit``, ``jobs``, ``status``, ``cancel``): requests and
their errors as one-line messages.

Server URL: ``--url``, else ``$TUNER_URL``, else ``http://127.0.0.1:8000``. Token: ``--token``, else
``$TUNER_TOKEN``, else the token file ``tuner serve`` writes when no ``TUNER_TOKENS`` is configured
(:func:`local_token_path`). Prefer the environment to ``--token``: command lines are visible to other users.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Any

from tuner.errors import TunerError, UserInputError

DEFAULT_URL = "http://127.0.0.1:8000"
MIN_TOKEN_LENGTH = 8  # of every bearer token, configured or local


class RemoteInputError(UserInputError):
    """The server refused the request (4xx) or cannot be reached; the CLI exits with code 2."""


class RemoteError(TunerError):
    """The server failed (5xx, e.g. 503 while its store is down); the CLI exits with code 1."""


def local_token_path() -> Path:
    """``token`` in :func:`tuner.settings.data_home` (beside the default SQLite store)."""
    from tuner.settings import data_home

    return data_home() / "token"


def local_token(*, create: bool) -> str | None:
    """The local token (owner-only file), created with a random value when ``create`` and absent.

    Raises UserInputError when the file is readable or writable by group or others (anyone who could read
    it could submit jobs), or holds a token shorter than :data:`MIN_TOKEN_LENGTH` characters.
    """
    path = local_token_path()
    try:
        with open(path) as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read().strip()
    except FileNotFoundError:
        text = ""
    else:
        if mode & 0o077:
            raise UserInputError(f"the token file {path} is accessible by group or others (mode "
                                 f"{stat.S_IMODE(mode):o}): make it owner-only (chmod 600) or delete it")
        if text and len(text) < MIN_TOKEN_LENGTH:
            raise UserInputError(f"the token in {path} is shorter than {MIN_TOKEN_LENGTH} characters: "
                                 "delete the file (`tuner serve` makes a new one)")
        if text:
            return text
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def resolve_url(url: str | None) -> str:
    """The server's base address: ``url``, else ``$TUNER_URL``, else the default. Raises RemoteInputError for an
    address that is not one (:func:`tuner.service.client.server_base`)."""
    from tuner.service.client import ClientError, server_base

    given = url or os.environ.get("TUNER_URL") or DEFAULT_URL
    try:
        return server_base(given)
    except ClientError as exc:
        raise RemoteInputError(f"{exc} (--url or $TUNER_URL)") from None


def resolve_token(token: str | None) -> str | None:
    return token or os.environ.get("TUNER_TOKEN") or local_token(create=False)


RETRY_PAUSES_S = (0.5, 2.0)  # between the tries of a request sent under an idempotency key


def call(method: str, path: str, *, url: str | None, token: str | None, json: Any = None,
         params: dict[str, Any] | None = None, timeout_s: float = 30.0, idempotency_key: str | None = None) -> Any:
    """One API request; the decoded JSON body. Raises RemoteInputError (4xx, unreachable), RemoteError (5xx).

    With ``idempotency_key`` (sent as ``Idempotency-Key``) a request whose answer did not come (the connection
    failed or timed out: it may have been served) is sent again, twice at most (:data:`RETRY_PAUSES_S`): the
    server answers a repeat with what the first one did (``POST /v1/jobs``: the job it created)."""
    import time

    import httpx

    from tuner.service.client import error_message

    base = resolve_url(url)
    token = resolve_token(token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    pauses = list(RETRY_PAUSES_S) if idempotency_key is not None else []
    while True:
        try:
            with httpx.Client(base_url=base, timeout=timeout_s, headers=headers) as client:
                response = client.request(method, path, json=json, params=params)
            break
        except httpx.HTTPError as exc:
            if pauses and isinstance(exc, httpx.TransportError):
                time.sleep(pauses.pop(0))
                continue
            raise RemoteInputError(f"cannot reach the tuner server at {base}: {type(exc).__name__}: {exc} (start "
                                   "one with `tuner serve`, or give its address with --url or $TUNER_URL)") from None
    if response.status_code >= 400:
        message = f"{response.status_code}: {error_message(response)}"
        if response.status_code in (401, 403):
            message += f" ({token_hint()})"
        raise (RemoteInputError if response.status_code < 500 else RemoteError)(message)
    return response.json()


def token_hint() -> str:
    """Where a token comes from, for a refused request: the tokens are the server's ``TUNER_TOKENS``, or its local
    token file when it has none."""
    return (f"give a token of the server's TUNER_TOKENS with --token or $TUNER_TOKEN; a server without "
            f"TUNER_TOKENS wrote its token to {local_token_path()}, which `tuner submit` on its host reads")
