"""Trial budgets: who may run the next measured trial of a study.

A budget hands out opaque slot tokens. ``reserve`` before a trial; the trial's measurement is stored with
the token's store slot (``slot_of``), which the store spends in the same transaction (so a measurement is
stored if and only if its slot is spent); ``release`` when the trial needed no measurement (invalid or
duplicate config) or could not finish. The CLI uses a local count (``DeadlineBudget`` adds its
``--time-limit``); the job queue's workers share a budget through slots in the store
(tuner.service.worker.SlotBudget).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class TrialBudget(Protocol):
    """Implementations must be safe across processes when several workers share a study."""

    def reserve(self) -> object | None:
        """A token for one more measured trial, or None when the budget is spent."""

    def release(self, token: object) -> None:
        """Give back a token that did not lead to a stored measurement (idempotent)."""

    def slot_of(self, token: object) -> int | None:
        """The store's trial slot behind ``token``, spent when the measurement is stored (None: the budget
        keeps no slots in the store, as a local count)."""


@dataclass
class CountBudget:
    """A local budget of ``n`` measured trials (the CLI's ``--trials``). Not thread-safe."""

    n: int
    used: int = 0
    _next: int = 0

    def reserve(self) -> object | None:
        if self.used >= self.n:
            return None
        self.used += 1
        self._next += 1
        return self._next

    def release(self, token: object) -> None:
        self.used -= 1

    def slot_of(self, token: object) -> int | None:
        return None


@dataclass
class DeadlineBudget:
    """``inner``'s slots until ``seconds`` have passed since construction (``clock``: time.monotonic by
    default), then none: no new trial starts after the limit, the trials already granted finish (a batch
    compiled together runs to its end), and the caller goes on to its final round. The CLI's
    ``--time-limit``. Not thread-safe (as the CountBudget it wraps). ValueError for a limit that is not
    positive."""

    inner: TrialBudget
    seconds: float
    clock: Callable[[], float] = time.monotonic
    # whether a slot the inner budget granted was refused for the time limit (not set when it had none left)
    expired: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"time limit must be positive, got {self.seconds!r}")
        self._deadline = self.clock() + self.seconds

    def reserve(self) -> object | None:
        token = self.inner.reserve()
        if token is not None and self.clock() >= self._deadline:
            self.inner.release(token)
            self.expired = True
            return None
        return token

    def release(self, token: object) -> None:
        self.inner.release(token)

    def slot_of(self, token: object) -> int | None:
        return self.inner.slot_of(token)
