"""On a CUDA device at full size: the default config within the template's bounds on every official
workload, and, where mamba_ssm's TileLang backward runs, no 16-bit gradient worse than 1.25x its error;
every lowp3 seed of the search space within the bounds too."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.mimo.mimo_helpers import TEMPLATE, errors
from tuner.kernels.mamba3_mimo.bwd_template import LOWP_OUTPUTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _run(kernel, shape, inputs):
    outs = TEMPLATE.allocate_outputs(shape, inputs)
    for v in outs.values():
        v.fill_(float("nan"))
    kernel(inputs, outs)
    torch.cuda.synchronize()
    return outs


@pytest.mark.parametrize("workload", [w.name for w in TEMPLATE.workloads])
def test_default_config_at_full_size(workload):
    shape = TEMPLATE.workload(workload)
    inputs = TEMPLATE.make_inputs(shape, "cuda", 11)
    refs = TEMPLATE.reference(shape, inputs)
    ours = errors(_run(TEMPLATE.build(TEMPLATE.space().default, shape), shape, inputs), refs)
    bounds = {o.name: o.rtol for o in TEMPLATE.outputs}
    assert all(ours[k] <= bounds[k] for k in ours), ours
    (cmp,) = TEMPLATE.comparators()
    reason = cmp.unavailable(shape)
    if reason is not None:
        pytest.skip(f"ours ok {ours}; TileLang: {reason}")
    theirs = errors(_run(cmp.build(shape), shape, inputs), refs)
    worse = {k: (ours[k], theirs[k]) for k in LOWP_OUTPUTS if ours[k] > 1.25 * theirs[k]}
    assert not worse, f"ours vs TileLang: {worse}; all ours {ours}; all TileLang {theirs}"


@pytest.mark.parametrize("workload", [w.name for w in TEMPLATE.workloads])
def test_every_seed_within_bounds_at_full_size(workload):
    # The seeds are what a new study measures first: split2 (two kernels through global scratch) among them.
    shape = TEMPLATE.workload(workload)
    space = TEMPLATE.space()
    inputs = TEMPLATE.make_inputs(shape, "cuda", 12)
    refs = TEMPLATE.reference(shape, inputs)
    bounds = {o.name: o.rtol for o in TEMPLATE.outputs}
    # lowp3 seeds only: with tf32 operands dMIMO_* land at 1.0-1.4e-3 on the H200, around their 1e-3 bound
    # (the sweep measures those seeds anyway and records the misses).
    for seed in (c for c in space.seeds if space.is_valid(c, shape) and c["prec"] == "lowp3"):
        ours = errors(_run(TEMPLATE.build(seed, shape), shape, inputs), refs)
        over = {k: e for k, e in ours.items() if e > bounds[k]}
        assert not over, f"{seed.to_json()}: {over}"
