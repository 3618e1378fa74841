"""Trial budgets: who may run the next measured trial of a study.

A budget hands out opaque slot tokens. ``reserve`` before a trial; ``record`` in the transaction that
stores the trial's measurement (so a measurement is stored if and only if its slot is spent); ``release``
when the trial needed no measurement (invalid or duplicate config) or could not finish. The CLI uses a local
count; the job queue's workers share a budget through slots in the store (tuner.service.worker.SlotBudget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

from tuner.results import MeasureResult


class TrialBudget(Protocol):
    """Implementations must be safe across processes when several workers share a study."""

    def reserve(self) -> object | None:
        """A token for one more measured trial, or None when the budget is spent."""

    def release(self, token: object) -> None:
        """Give back a token that did not lead to a stored measurement (idempotent)."""

    def record(
        self, session: Session, token: object, *, trial_number: int, measurement_id: int, result: MeasureResult
    ) -> None:
        """Spend ``token`` on this measurement inside ``session``'s transaction; may raise to roll it back."""


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

    def record(
        self, session: Session, token: object, *, trial_number: int, measurement_id: int, result: MeasureResult
    ) -> None:
        return None
