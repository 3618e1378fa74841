"""Every use of Optuna beyond its documented study API, in one place.

The driver needs a few things Optuna keeps private or only half public: a trial's storage id
(``_trial_id``, which the storage API takes), the parameters an enqueued trial will get (the
``fixed_params`` system attribute that ``Study.enqueue_trial`` writes), the heartbeat settings of an RDB
storage, and asking a trial with heartbeats on outside ``Study.optimize`` (Optuna warns about it; tuner
records heartbeats itself). When Optuna changes these, this module is what changes.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

optuna.logging.set_verbosity(optuna.logging.WARNING)


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The storage's id of a trial (what ``BaseStorage`` methods take; not its number in the study)."""
    return int(trial._trial_id)


def waiting_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The study's queue: its WAITING trials (enqueued configs not asked yet), oldest first."""
    return study.get_trials(deepcopy=False, states=(TrialState.WAITING,))


def queued_params(trial: FrozenTrial) -> dict[str, Any]:
    """The parameters a trial has or, for an enqueued trial not yet suggested, the ones it will get."""
    fixed: Mapping[str, Any] = trial.system_attrs.get("fixed_params", trial.params)
    return dict(fixed)


def has_fixed_params(trial: FrozenTrial) -> bool:
    """Whether the trial was enqueued with parameters (a seed or a retry)."""
    return "fixed_params" in trial.system_attrs


def heartbeats_enabled(storage: optuna.storages.BaseStorage | None) -> bool:
    """Whether trials of this storage carry heartbeats (an RDB storage opened with a heartbeat interval)."""
    return isinstance(storage, optuna.storages.RDBStorage) and bool(storage.get_heartbeat_interval())


def heartbeat_timing(storage: optuna.storages.BaseStorage) -> tuple[float, float]:
    """(heartbeat interval, grace period) in seconds of a storage with heartbeats."""
    interval = getattr(storage, "heartbeat_interval", None) or 1
    grace = getattr(storage, "grace_period", None) or 2 * interval
    return float(interval), float(grace)


def record_heartbeat(storage: optuna.storages.BaseStorage, trial: int) -> None:
    """Beat for the trial with storage id ``trial`` (no-op on a storage without heartbeats)."""
    if heartbeats_enabled(storage):
        storage.record_heartbeat(trial)  # type: ignore[attr-defined]


def ask(study: optuna.Study) -> optuna.Trial:
    """``study.ask()`` without Optuna's warning that heartbeats are meant for ``Study.optimize``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
        return study.ask()


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail (and so retry, through the storage's callback) the trials whose heartbeats stopped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
