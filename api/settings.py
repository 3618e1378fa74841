"""Settings of the HTTP API, from the environment (prefix ``TUNER_``), typed and frozen (pydantic-settings).

``TUNER_DB_URL``               the store (unset: the SQLite file ``$TUNER_HOME/tuner.db``).
``TUNER_TOKENS``               bearer tokens and their scopes, as JSON:
                               ``{"<token>": ["submit", "read"], "<other token>": ["read"]}``.
                               Scopes: ``submit`` (create and cancel jobs), ``read`` (every GET when
                               ``TUNER_READ_REQUIRES_TOKEN`` is on), ``worker`` (reserved for worker endpoints;
                               workers talk to the database directly today, so no endpoint needs it yet).
                               Scopes are independent: a client that submits and reads protected data
                               needs both.
``TUNER_READ_REQUIRES_TOKEN``  ``true``: reads need a token with the ``read`` scope (default: reads are open).
``TUNER_MAX_BODY_BYTES``       larger request bodies are refused with 413 (default 65536).
``TUNER_BEST_CACHE_TTL_S``     seconds a ``GET /v1/best`` answer is fresh (default 1; served stale while it is
                               recomputed for as long again; 0 disables the caches).
``TUNER_WARM_TEMPLATES``       import every registered template before serving (default true), so that no
                               request waits for (or is slowed down by) a kernel module's import.
``TUNER_BEST_CACHE_SIZE``      answers kept in the best-config cache (default 10000).
``TUNER_REVERIFY_FOREIGN``     ``true`` (default): a best answered from a config verified on another device name
                               or software queues a verify job on the requester's device (:mod:`tuner.api.reverify`).
``TUNER_REVERIFY_PROCESSES``   fresh processes of such a verify job (default 5).
``TUNER_REVERIFY_COMPARATOR_PROCESSES``  the comparators re-measured in only the first that many of them
                               (default: all; 1 for a comparator that compiles for minutes per process).

Tokens are kept out of ``repr`` and never logged; compare them with :meth:`ApiSettings.scopes_of` only.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tuner.service.remote import MIN_TOKEN_LENGTH

Scope = Literal["submit", "read", "worker"]
SCOPES: tuple[Scope, ...] = ("submit", "read", "worker")


class ApiSettings(BaseSettings):
    """Immutable API configuration; construct with keyword arguments in tests, from the environment otherwise."""

    # hide_input_in_errors: a validation error must not print the tokens it was given.
    model_config = SettingsConfigDict(env_prefix="TUNER_", frozen=True, extra="ignore", hide_input_in_errors=True)

    db_url: str | None = None
    tokens: dict[str, frozenset[Scope]] = Field(default_factory=dict, repr=False)
    read_requires_token: bool = False
    max_body_bytes: int = Field(default=65_536, ge=1024)
    best_cache_ttl_s: float = Field(default=1.0, ge=0.0)
    best_cache_size: int = Field(default=10_000, ge=1)
    warm_templates: bool = True
    reverify_foreign: bool = True
    reverify_processes: int = Field(default=5, ge=1, le=50)
    reverify_comparator_processes: int | None = Field(default=None, ge=1, le=50)

    @field_validator("reverify_comparator_processes", mode="before")
    @classmethod
    def _empty_is_all(cls, raw: object) -> object:
        return None if raw == "" else raw  # TUNER_REVERIFY_COMPARATOR_PROCESSES= (set empty): every process

    @field_validator("reverify_comparator_processes")
    @classmethod
    def _within_reverify_processes(cls, limit: int | None, info: ValidationInfo) -> int | None:
        processes = info.data.get("reverify_processes")
        if limit is not None and processes is not None and limit > processes:
            raise ValueError(f"must be at most TUNER_REVERIFY_PROCESSES ({processes}), got {limit}")
        return limit

    @field_validator("tokens", mode="before")
    @classmethod
    def _check_tokens(cls, raw: object) -> dict[str, frozenset[str]]:
        # Checked here, by hand, so that no error names a token (pydantic would put a bad dict key in `loc`).
        if not isinstance(raw, dict):
            raise ValueError('expected a JSON object {"<token>": ["submit", "read"], ...}')
        tokens: dict[str, frozenset[str]] = {}
        for token, scopes in raw.items():
            if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH or token != token.strip():
                raise ValueError(f"every token must have at least {MIN_TOKEN_LENGTH} characters and no "
                                 "surrounding spaces")
            label = token_label(token)
            if isinstance(scopes, str) or not isinstance(scopes, (list, tuple, set, frozenset)) or not scopes:
                raise ValueError(f"{label}: expected a non-empty list of scopes ({', '.join(SCOPES)})")
            unknown = sorted(str(s) for s in scopes if s not in SCOPES)
            if unknown:
                raise ValueError(f"{label}: unknown scope(s) {', '.join(unknown)}; known: {', '.join(SCOPES)}")
            tokens[token] = frozenset(scopes)
        return tokens

    def scopes_of(self, presented: str) -> frozenset[Scope] | None:
        """The scopes of a presented token, or None when it matches no configured token.

        Compares against every configured token with :func:`hmac.compare_digest` (no early exit), so the
        time taken does not tell which token, or how much of one, matched.
        """
        given = presented.encode()
        found: frozenset[Scope] | None = None
        for token, scopes in self.tokens.items():
            if hmac.compare_digest(given, token.encode()):
                found = scopes
        return found


def token_label(token: str) -> str:
    """A non-secret name for a token (its SHA-256 prefix), safe to store as ``submitted_by`` and to log."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:10]
