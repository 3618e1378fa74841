"""``/v1/studies``: which studies the store holds (filtered, paged), one study's summary, final round and
failures, and its measurements (paged, sorted, filtered by status). Same auth as every read."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from tuner.api import explore
from tuner.api.deps import CatalogDep, Reader, StoreDep
from tuner.api.errors import FieldError
from tuner.api.importance import ImportanceOut, Importances
from tuner.api.schemas import MAX_ID, MAX_OFFSET, DeviceKind, MeasurementOut
from tuner.api.study_schemas import StudyDetail, StudyPage, TrialPage
from tuner.db.explore import SORTS
from tuner.errors import ShapeError, UnknownTemplateError
from tuner.results import Status
from tuner.shapes import parse_shape_text

router = APIRouter(tags=["studies"])
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such study"}}
StatusName = Annotated[str, Query(max_length=32)]
SortName = Annotated[str, Query(max_length=32, description=f"One of {', '.join(SORTS)} ('-': descending).")]
StudyId = Annotated[int, Path(ge=1, le=MAX_ID, description="A study's id.")]


def shape_dims(text: str | None, catalog: CatalogDep, template: str | None) -> dict[str, str]:
    """``B=8,H=64`` → dims to match, written as stored keys write them; FieldError (422) for malformed text, or
    for a dim the template does not have when the template is known."""
    if not text:
        return {}
    try:
        dims = parse_shape_text(text)
    except ShapeError as exc:
        raise FieldError.wrap(exc, ("query", "shape")) from None
    if template is not None:
        try:
            known = {d.name for d in catalog.get(template).spec.dims}
        except UnknownTemplateError:
            known = set(dims)  # no such template here: nothing matches, which the page says
        unknown = sorted(set(dims) - known)
        if unknown:
            raise FieldError(f"unknown shape dim(s) {', '.join(unknown)} for {template}; known: "
                             f"{', '.join(sorted(known))}", ("query", "shape"))
    return {name: value.lower() if value.lower() in ("true", "false") else value for name, value in dims.items()}


def statuses(values: list[str] | None) -> list[str]:
    """Status names, checked (422 naming the bad one); several may be given, or one comma-separated list."""
    names = [v.strip().upper() for raw in values or [] for v in raw.split(",") if v.strip()]
    known = [s.value for s in Status]
    for i, name in enumerate(names):
        if name not in known:
            raise FieldError(f"unknown status {name!r}; known: {', '.join(known)}", ("query", "status", i))
    return names


@router.get("/studies", response_model=StudyPage, summary="Studies in the store, newest first, filtered and paged")
def list_studies(
    _: Reader,
    store: StoreDep,
    catalog: CatalogDep,
    template: Annotated[str | None, Query(max_length=128)] = None,
    version: Annotated[str | None, Query(max_length=64, description="Template version.")] = None,
    device: DeviceKind | None = None,
    device_name: Annotated[str | None, Query(max_length=256)] = None,
    shape: Annotated[str | None, Query(max_length=2048, description=(
        "Dims to match, e.g. B=8,H=64: a study is listed when its shape has each dim at exactly that value. "
        "Names and values are compared case-sensitively, as the template writes them (true/false in any "
        "case); with a template, a dim it does not have is a 422."))] = None,
    order: Annotated[Literal["newest", "activity"], Query(description=(
        "newest: the newest study first; activity: the study measured last first (the overview's list)."))] = "newest",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> StudyPage:
    dims = shape_dims(shape, catalog, template)
    summaries, total = store.list_study_summaries(
        template=template, template_version=version, device_kind=device, device_name=device_name, dims=dims,
        limit=limit, offset=offset, by_activity=order == "activity",
    )
    return StudyPage(items=[explore.brief(catalog, s) for s in summaries], total=total, limit=limit, offset=offset)


def not_found(study_id: int) -> FieldError:
    return FieldError(f"no study {study_id}", ("path", "study_id"), status=404, kind="not_found")


@router.get("/studies/{study_id}", response_model=StudyDetail, responses=_NOT_FOUND,
            summary="One study: counts, published best, latest final round, failures by reason")
def get_study(study_id: StudyId, _: Reader, store: StoreDep, catalog: CatalogDep) -> StudyDetail:
    summary = store.get_study_summary(study_id=study_id)
    if summary is None:
        raise not_found(study_id)
    return explore.detail(store, catalog, summary)


@router.get("/studies/{study_id}/trials", response_model=TrialPage, responses=_NOT_FOUND,
            summary="A study's measurements: paged, sorted, filtered by status and role")
def list_trials(
    study_id: StudyId,
    _: Reader,
    store: StoreDep,
    status: Annotated[list[str] | None, Query(max_length=16, description="Only these statuses (repeat, or "
                                              "comma-separated).")] = None,
    role: Annotated[Literal["trial", "final", "all"], Query(description="Sweep trials, final rounds, or both.")]
    = "trial",
    sort: SortName = "id",
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> TrialPage:
    if sort not in SORTS:
        raise FieldError(f"sort must be one of {', '.join(SORTS)}", ("query", "sort"))
    wanted = statuses(status)
    if store.get_study(study_id=study_id) is None:
        raise not_found(study_id)
    page = store.page_measurements(study_id=study_id, role=None if role == "all" else role, statuses=wanted,
                                   sort=sort, limit=limit, offset=offset)
    return TrialPage(study_id=study_id, items=[MeasurementOut.of(m) for m in page.items], total=page.total,
                     limit=limit, offset=offset)


@router.get("/studies/{study_id}/importance", response_model=ImportanceOut, responses=_NOT_FOUND,
            summary="Parameter importance of a study's sweep (Optuna's PED-ANOVA evaluator, computed on request)")
async def importance(study_id: StudyId, request: Request, _: Reader, store: StoreDep) -> ImportanceOut:
    importances: Importances = request.app.state.importances

    def compute() -> ImportanceOut:
        study = store.get_study(study_id=study_id)
        if study is None:
            raise not_found(study_id)
        return importances.of(store, study)

    return await run_in_threadpool(compute)
