"""Parameter importance of a study, by Optuna's own evaluator, computed on request and cached.

Why on request: the API process imports no Optuna at start-up (it serves best configs and pages without it),
and importance is a view of the sweep that only the study page asks for, after the page has rendered (its
script fetches ``GET /v1/studies/{id}/importance``). Optuna is imported the first time, from the study's
Optuna storage in the same database; when Optuna is not installed the answer says so instead of failing.

Evaluator: PED-ANOVA (``optuna.importance.PedAnovaImportanceEvaluator``): how much each parameter matters for
reaching the fastest 10% of the configs measured OK. Each config counts once, with its first completed trial:
a config proposed again is told its stored time again (``duplicate_of``), and two workers may measure one
config at once, so the study's completed trials repeat configs, and the repeats (the sampler returns to the
fastest) would fill the top 10% with copies of a few configs. It needs nothing beyond Optuna (fANOVA would
need scikit-learn) and takes milliseconds on sweeps of hundreds of trials. Results are cached per study and
number of completed trials (a running sweep gets fresh figures as trials complete). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, Field

from tuner import db
from tuner.db.optuna_tables import optuna_errors

log = logging.getLogger(__name__)
MIN_TRIALS = 4
EVALUATOR = "PED-ANOVA (Optuna), top 10% of the configs measured OK"


class ImportanceOut(BaseModel):
    study_id: int
    evaluator: str
    trials: int = Field(description="Distinct configs the importance was computed from: those of the study's "
                                    "completed (OK) trials, a config measured or told again counted once.")
    importances: dict[str, float] = Field(description="Parameter → importance (sums to 1), most important first.")
    note: str | None = Field(description="Why there is no figure, or how to read it.")


class Importances:
    """Computes and caches importances; one instance per app."""

    def __init__(self, max_entries: int = 256) -> None:
        self._storages: dict[str, Any] = {}
        self._cache: OrderedDict[tuple[int, int], ImportanceOut] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def of(self, store: db.Store, study: db.StudyRecord) -> ImportanceOut:
        """The study's importances. Blocks (imports Optuna once, reads the study's trials): call from a worker
        thread. Raises StoreError when the database is unreachable or refuses (Optuna's storage errors are
        translated here, as the store translates its own: the API answers 503)."""
        try:
            import optuna
        except ImportError:
            return ImportanceOut(study_id=study.id, evaluator=EVALUATOR, trials=0, importances={},
                                 note="Optuna is not installed where the server runs")
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # as in every tuner process: no line per copy
        storage = self._storage(store)
        try:
            with optuna_errors(store):  # its storage's errors as StoreError (503)
                loaded = optuna.load_study(study_name=study.name, storage=storage)
                complete = loaded.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        except KeyError:
            return ImportanceOut(study_id=study.id, evaluator=EVALUATOR, trials=0, importances={},
                                 note="no Optuna study of this name in the store (measurements only)")
        key = (study.id, len(complete))
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        out = self._compute(optuna, loaded, study.id, _first_of_each_config(complete))
        with self._lock:
            self._cache[key] = out
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return out

    def _storage(self, store: db.Store) -> Any:
        """The store's Optuna storage, opened once per database as the workers open it (its tables created
        under the store's schema lock, its PostgreSQL statements and pool checks under the store's deadlines).
        Raises StoreError when the database cannot be reached for the lock."""
        url = store.optuna_url
        with self._lock:
            storage = self._storages.get(url)
            if storage is None:
                storage = self._storages[url] = store.optuna_storage()
        return storage

    @staticmethod
    def _compute(optuna: Any, study: Any, study_id: int, trials: list[Any]) -> ImportanceOut:
        """PED-ANOVA over ``trials`` (completed, one per config), on an in-memory copy of ``study`` holding
        only them (the evaluator reads every completed trial of the study it is given)."""
        n = len(trials)
        if n < MIN_TRIALS:
            return ImportanceOut(study_id=study_id, evaluator=EVALUATOR, trials=n, importances={},
                                 note=f"needs at least {MIN_TRIALS} distinct configs measured OK ({n} so far)")
        view = optuna.create_study(storage=optuna.storages.InMemoryStorage(), directions=study.directions)
        view.add_trials(trials)
        try:
            values = optuna.importance.get_param_importances(
                view, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), normalize=True)
        except (ValueError, RuntimeError) as exc:  # e.g. every parameter fixed: nothing to rank
            log.info("importance of study %d: %s", study_id, exc)
            return ImportanceOut(study_id=study_id, evaluator=EVALUATOR, trials=n, importances={},
                                 note=f"cannot rank parameters: {exc}")
        return ImportanceOut(study_id=study_id, evaluator=EVALUATOR, trials=n,
                             importances={k: float(v) for k, v in values.items()},
                             note="how much each parameter decides whether a config is among the fastest 10%")


def _first_of_each_config(complete: list[Any]) -> list[Any]:
    """The first of ``complete`` (Optuna's completed trials, in trial order) with each set of parameters."""
    first: dict[tuple[tuple[str, Any], ...], Any] = {}
    for trial in complete:
        first.setdefault(tuple(sorted(trial.params.items())), trial)
    return list(first.values())
