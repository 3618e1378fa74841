"""``GET /v1/history``: every measurement of a shape's study on a device kind, paged, failures with reasons."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from tuner.api.deps import CatalogDep, Reader, StoreDep
from tuner.api.errors import FieldError
from tuner.api.schemas import MAX_ID, MAX_OFFSET, DeviceKind, HistoryPage, MeasurementOut, StudyOut
from tuner.api.shape_params import raw_shape
from tuner.errors import ShapeError, UnknownTemplateError
from tuner.store import StudyRecord

router = APIRouter(tags=["history"])
RESERVED = frozenset({"template", "shape", "device", "device_name", "study_id", "role", "limit", "offset"})


@router.get("/history", response_model=HistoryPage, summary="Measurements of one study, paged",
            responses={404: {"description": "Unknown template, or no study for the shape"}})
def history(
    request: Request,
    _: Reader,
    catalog: CatalogDep,
    store: StoreDep,
    template: Annotated[str, Query(max_length=128)],
    device: DeviceKind,
    shape: Annotated[str | None, Query(max_length=2048, description="B=1,S=4096,… or one parameter per dim")] = None,
    device_name: Annotated[str | None, Query(max_length=256)] = None,
    study_id: Annotated[int | None, Query(ge=1, le=MAX_ID,
                                          description="One of the listed studies (default: the newest)")] = None,
    role: Annotated[str | None, Query(pattern="^(trial|final)$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> HistoryPage:
    try:
        entry = catalog.get(template)
    except UnknownTemplateError as exc:
        raise FieldError.wrap(exc, ("query", "template")) from None
    raw = raw_shape(shape, request.query_params.multi_items(), RESERVED)
    try:
        the_shape = entry.spec.make_shape(raw)
    except ShapeError as exc:
        raise FieldError.wrap(exc, ("query", "shape")) from None
    studies = [
        s for s in store.list_studies(template=entry.name, device_kind=device)
        if s.shape_key == the_shape.key() and device_name in (None, s.device_name)
    ]
    if not studies:
        raise FieldError(f"no study of {entry.name} for {the_shape.key()} on {device}", ("query", "shape"),
                         status=404, kind="not_found")
    chosen = [s for s in studies if s.id == study_id] if study_id is not None else [studies[-1]]
    if not chosen:
        raise FieldError(f"study {study_id} is not one of this shape's", ("query", "study_id"), status=404,
                         kind="not_found")
    rows = store.list_measurements(study_id=chosen[0].id, role=role, limit=limit, offset=offset)
    total = store.count_measurements(study_id=chosen[0].id, role=role)
    return HistoryPage(
        study=_study(chosen[0]), studies=[_study(s) for s in studies], items=[MeasurementOut.of(m) for m in rows],
        total=total, limit=limit, offset=offset,
    )


def _study(s: StudyRecord) -> StudyOut:
    return StudyOut(id=s.id, name=s.name, template_version=s.template_version, device_kind=s.device_kind,
                    device_name=s.device_name, fingerprint=s.fingerprint_hash, created_at=s.created_at)
