"""``/v1/templates``: the registered templates with their dims, parameters, constraints, default, workloads."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query

from tuner.api.catalog import CatalogEntry
from tuner.api.deps import CatalogDep, Reader, StoreDep
from tuner.api.errors import FieldError
from tuner.api.schemas import ConstraintOut, DeviceKind, DimOut, ParamOut, RegretOut, TemplateOut, WorkloadOut
from tuner.errors import TunerError, UnknownTemplateError
from tuner.service.regret import recorded_shapes, regret_reports

router = APIRouter(tags=["templates"])
log = logging.getLogger(__name__)


@router.get("/templates", response_model=list[TemplateOut], summary="Every registered template that loads")
def list_templates(_: Reader, catalog: CatalogDep) -> list[TemplateOut]:
    """Templates whose spec or search space does not load are left out of the list (and logged): one broken
    registration must not hide the others; ``GET /v1/templates/{name}`` says what is wrong with it."""
    found = []
    for name in catalog.names():
        try:
            found.append(describe(catalog.get(name)))
        except (TunerError, ImportError, AttributeError, TypeError) as exc:
            log.warning("GET /v1/templates: template %s left out: %s", name, exc)
    return found


@router.get("/templates/{name}", response_model=TemplateOut, summary="One template",
            responses={404: {"description": "Unknown template"}})
def get_template(name: str, _: Reader, catalog: CatalogDep) -> TemplateOut:
    try:
        return describe(catalog.get(name))
    except UnknownTemplateError as exc:
        raise FieldError.wrap(exc, ("path", "name")) from None


@router.get("/templates/{name}/regret", response_model=list[RegretOut],
            summary="Nearest-shape regret of the lookup, leave-one-out over the store (one per version and device)",
            responses={404: {"description": "Unknown template"}})
def template_regret(
    name: str, _: Reader, catalog: CatalogDep, store: StoreDep,
    device: Annotated[DeviceKind | None, Query(description="Only this device kind.")] = None,
) -> list[dict[str, Any]]:
    """For every shape with its own best: the config the lookup would serve without it (current distance),
    timed from that shape's records against its own best; unmeasured when its records lack the config."""
    try:
        entry = catalog.get(name)
    except UnknownTemplateError as exc:
        raise FieldError.wrap(exc, ("path", "name")) from None
    default = entry.space.default.to_dict()

    def space_of(version: str) -> Any:
        return (default, entry.space.constraint_check, entry.space.domains) if version == entry.spec.version else None

    reports = regret_reports(recorded_shapes(store, template=name, device_kind=device), space_of=space_of)
    return [r.to_dict() for r in reports]


def describe(entry: CatalogEntry) -> TemplateOut:
    t, space = entry.spec, entry.space
    return TemplateOut(
        name=t.name, version=t.version, backend=t.backend, doc=t.doc or space.doc,
        dims=[
            DimOut(name=d.name, kind=d.kind, default=d.default, choices=list(d.choices) if d.choices else None,
                   minimum=d.minimum if d.kind == "int" else None, maximum=d.maximum if d.kind == "int" else None,
                   doc=d.doc)
            for d in t.dims
        ],
        parameters=[ParamOut(name=p.name, kind=p.kind, choices=list(p.choices), doc=p.doc) for p in space.params],
        constraints=[ConstraintOut(expr=c.expression.source, reason=c.reason) for c in space.constraints],
        default=space.default.to_dict(),
        workloads=[WorkloadOut(name=w.name, shape=dict(w.shape), doc=w.doc) for w in t.workloads],
        max_elements=t.max_elements,
    )
