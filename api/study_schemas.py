"""Response bodies of ``/v1/studies`` (pydantic v2): what the exploration pages show, as JSON.

Times are microseconds of device time (CPU time for the CPU backend: see ``timer``); ratios are
``other / best`` (above 1: the tuned config is faster).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from tuner.api.schemas import MeasurementOut, Page


class StudyBrief(BaseModel):
    """One study (template version × shape × device × software fingerprint) and its counts."""

    id: int
    label: str = Field(description="A readable name: workload (or shape), template and version, device.")
    name: str = Field(description="The Optuna study name (the full key).")
    template: str
    template_version: str
    workload: str | None = Field(description="The named workload of this shape, if any.")
    shape: dict[str, Any]
    shape_key: str
    device_kind: str
    device_name: str
    fingerprint: str
    created_at: datetime
    last_activity: datetime
    trials: int = Field(description="Sweep trials measured (INVALID configs excluded).")
    failed: int = Field(description="Measured sweep trials that did not end OK.")
    invalid: int = Field(description="Configs rejected by a constraint before any build.")
    statuses: dict[str, int] = Field(description="Sweep trials per status.")
    best_us: float | None = Field(description="The published best config's median (final round), µs.")
    best_p20_us: float | None
    best_p80_us: float | None
    best_config: dict[str, Any] | None
    fastest_trial_us: float | None = Field(description="The fastest sweep trial's median, µs.")
    page: str = Field(description="Path of the study's page.")


class StudyPage(Page):
    items: list[StudyBrief]


class FinalOut(MeasurementOut):
    """A candidate of the final interleaved round."""

    errors: dict[str, float | None] = Field(description="Relative L2 error per output (null: NaN).")
    ratio: float | None = Field(description="This candidate's median / the best's (above 1: slower than best).")


class FailureOut(BaseModel):
    status: str
    reason: str = Field(description="First line of the reason.")
    count: int


class StudyDetail(StudyBrief):
    fingerprint_info: dict[str, Any] = Field(description="Device, driver, runtime and library versions.")
    best_measurement_id: int | None
    default_us: float | None = Field(description="The template default's median in the final round, µs.")
    timer: str | None
    final_round: list[FinalOut] = Field(description="The latest final round, fastest first.")
    failures: list[FailureOut] = Field(description="Failed sweep trials by status and reason.")


class TrialPage(Page):
    study_id: int
    items: list[MeasurementOut]
