"""What a verify task's verification found, as ``GET /v1/jobs/{id}`` and the job page say it
(:func:`tuner.api.jobs_view.verification_out`): right, drifted, wrong (with the failing process's reason)
or not measured, with the device and the figures."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from tuner.api.jobs_view import verification_out
from tuner.store import VerificationRecord
from tuner.store.records import VERIFIED_LABEL


def _check(median_us: float | None, statuses: list[tuple[str, str | None]], *, flagged: bool) -> VerificationRecord:
    figures = [{"process": i, "candidates": [{"label": VERIFIED_LABEL, "status": status, "reason": reason},
                                             {"label": "comparator:x", "status": "WRONG_RESULT", "reason": "not it"}]}
               for i, (status, reason) in enumerate(statuses, start=1)]
    return VerificationRecord(
        id=7, study_id=3, config_json='{"x":1}', stored_us=10.0, median_us=median_us, low_us=median_us,
        high_us=median_us, drift=None if median_us is None else median_us / 10.0 - 1, tolerance=0.03,
        flagged=flagged, processes=len(statuses), figures_json=json.dumps(figures), device_kind="cuda",
        device_name="NVIDIA H100", fingerprint_hash="f", fingerprint_json="{}", worker="w",
        created_at=datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc))


@pytest.mark.parametrize(("check", "verdict", "reason", "summary"), [
    (_check(10.1, [("OK", None)] * 2, flagged=False), "right", None,
     "right: 10.10 µs over 2 fresh processes on NVIDIA H100, +1.0% against 10.00 µs stored (tolerance ±3%)"),
    (_check(12.0, [("OK", None)], flagged=True), "drifted", None,
     "drifted: 12.00 µs over 1 fresh process on NVIDIA H100, +20.0% against 10.00 µs stored (tolerance ±3%)"),
    (_check(10.0, [("OK", None), ("RUNTIME_ERROR", "crashed"), ("WRONG_RESULT", "relative L2 error 0.02")],
            flagged=True), "wrong", "relative L2 error 0.02",
     "wrong results in 1 of 3 fresh processes on NVIDIA H100: relative L2 error 0.02"),
    (_check(None, [("TIMEOUT", "over 60 s"), ("RUNTIME_ERROR", "crashed")], flagged=True), "not measured",
     "over 60 s", "did not measure OK in any of 2 fresh processes on NVIDIA H100: over 60 s"),
])
def test_a_verification_says_what_it_found(check: VerificationRecord, verdict: str, reason: str | None,
                                          summary: str) -> None:
    found: dict[str, Any] = verification_out(check).model_dump()
    assert (found["verdict"], found["reason"], found["summary"]) == (verdict, reason, summary)
    assert (found["id"], found["study_id"], found["config"], found["device_name"]) == (7, 3, {"x": 1}, "NVIDIA H100")
    assert found["flagged"] is check.flagged and found["wrong_processes"] == check.wrong_processes
    assert found["verified_at"].startswith("2026-12-02T12:00:00")
