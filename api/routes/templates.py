"""``/v1/templates``: the registered templates with their dims, parameters, constraints, default, workloads."""

from __future__ import annotations

from fastapi import APIRouter

from tuner.api.catalog import CatalogEntry
from tuner.api.deps import CatalogDep, Reader
from tuner.api.errors import FieldError
from tuner.api.schemas import ConstraintOut, DimOut, ParamOut, TemplateOut, WorkloadOut
from tuner.errors import UnknownTemplateError

router = APIRouter(tags=["templates"])


@router.get("/templates", response_model=list[TemplateOut], summary="Every registered template")
def list_templates(_: Reader, catalog: CatalogDep) -> list[TemplateOut]:
    return [describe(catalog.get(name)) for name in catalog.names()]


@router.get("/templates/{name}", response_model=TemplateOut, summary="One template",
            responses={404: {"description": "Unknown template"}})
def get_template(name: str, _: Reader, catalog: CatalogDep) -> TemplateOut:
    try:
        return describe(catalog.get(name))
    except UnknownTemplateError as exc:
        raise FieldError.wrap(exc, ("path", "name")) from None


def describe(entry: CatalogEntry) -> TemplateOut:
    t, space = entry.template, entry.space
    return TemplateOut(
        name=t.name, version=t.version, backend=t.backend, doc=t.doc or space.doc,
        dims=[
            DimOut(name=d.name, kind=d.kind, default=d.default, choices=list(d.choices) if d.choices else None,
                   minimum=d.minimum if d.kind == "int" else None, doc=d.doc)
            for d in t.dims
        ],
        parameters=[ParamOut(name=p.name, kind=p.kind, choices=list(p.choices), doc=p.doc) for p in space.params],
        constraints=[ConstraintOut(expr=c.expression.source, reason=c.reason) for c in space.constraints],
        default=space.default.to_dict(),
        workloads=[WorkloadOut(name=w.name, shape=dict(w.shape), doc=w.doc) for w in t.workloads],
    )
