"""``GET /v1/best`` — see :mod:`tuner.api.best_service` for the lookup and its caches."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from tuner.api.best_service import BestRequest, BestService
from tuner.api.deps import Reader
from tuner.api.schemas import BestOut, DeviceKind
from tuner.api.shape_params import raw_shape, software_versions
from tuner.errors import StoreError

router = APIRouter(tags=["best"])
RESERVED = frozenset({"template", "shape", "device", "device_name", "fingerprint", "software", "template_version"})


@router.get(
    "/best",
    response_model=BestOut,
    summary="The best verified config for a shape (exact, else nearest measured shape, else the default)",
    responses={404: {"description": "Unknown template"}, 422: {"description": "Malformed or rejected shape"}},
    description="While the store is unreachable, the last answer computed for the same query is served with "
                "`stale: true` and the header `x-stale: true` (503 when there is none).",
)
async def best(
    request: Request,
    _: Reader,
    template: Annotated[str, Query(max_length=128)],
    device: Annotated[DeviceKind, Query(description="Device kind.")],
    shape: Annotated[str | None, Query(
        max_length=2048, description="B=1,S=4096,H=48 — or pass each dim as its own query parameter (B=1&S=…).",
    )] = None,
    device_name: Annotated[str | None, Query(max_length=256, description='Prefer configs measured on it.')] = None,
    fingerprint: Annotated[str | None, Query(max_length=64, description="Only configs of this fingerprint.")] = None,
    software: Annotated[str | None, Query(
        max_length=1024, description="The requester's software, NAME=VERSION pairs separated by commas: driver, "
        "runtime (CUDA/CANN), torch, triton, tilelang. Entries verified under these are preferred, and an answer "
        "is `exact` only if every given one matches (others: `nearest`, listed in `differences`). Left out: "
        "software is not compared (listed in `unchecked`).")] = None,
    template_version: Annotated[str | None, Query(
        max_length=64, description="The template version the requester runs; another version's config is "
        "never `exact`.")] = None,
) -> Response:
    service: BestService = request.app.state.best
    key = request.scope["query_string"]
    hit = service.answers.get(key)
    if hit is None:
        the_request = BestRequest(template, raw_shape(shape, request.query_params.multi_items(), RESERVED),
                                  device, device_name, fingerprint, software_versions(software), template_version)
        try:
            rendered = await run_in_threadpool(service.render, the_request)
        except StoreError:
            hit = service.answers.fallback(key)  # the last answer, marked stale; else the 503
            if hit is None:
                raise
        else:
            service.answers.put(key, *rendered)
            return Response(rendered[0], media_type="application/json", headers={"x-cache": "miss"})
    # a cached answer (the middleware serves most of them before routing)
    headers = {"x-cache": "hit", **({"x-stale": "true"} if hit.stale else {})}
    return Response(hit.body, media_type="application/json", headers=headers)

