"""The template's contract: shapes, workloads, search space, inputs, output dtypes, the default config run
end to end at a reduced workload shape, the comparator's availability."""

from __future__ import annotations

import json

import pytest
import torch

from tests.kernels.mimo.mimo_helpers import TEMPLATE, errors, tiny
from tuner import registry
from tuner.errors import ShapeError
from tuner.kernels.mamba3_mimo import comparator_mamba_ssm as tl_cmp
from tuner.kernels.mamba3_mimo.bwd_template import LOWP_OUTPUTS, Mamba3MimoBwd


def test_eleven_official_workloads_with_valid_default_config():
    space = TEMPLATE.space()
    assert len(TEMPLATE.workloads) == 11
    for w in TEMPLATE.workloads:
        shape = TEMPLATE.workload(w.name)
        assert (shape["B"], shape["S"], shape["H"], shape["G"]) == (4, 2048, 16, 1)
        assert (shape["rotary_divisor"], shape["dtype"]) == (4, "bfloat16")
        assert space.check(space.default, shape) is None, w.name
        assert space.check(space.default, TEMPLATE.reduced(shape)) is None, w.name


@pytest.mark.parametrize(("dims", "match"), [
    ({"N": 48}, "power of two"), ({"H": 3, "G": 2}, "multiple of G"), ({"rotary_divisor": 8}, "2 or 4"),
    ({"S": 20}, "multiple of 8"), ({"P": 8}, ">= 16"),
])
def test_rejects_bad_shapes(dims, match):
    base = {"B": 1, "S": 32, "H": 2, "N": 16, "P": 16, "R": 2}
    with pytest.raises(ShapeError, match=match):
        TEMPLATE.make_shape({**base, **dims})


def test_space_prunes_chunks_that_do_not_fit():
    space = TEMPLATE.space()
    shape = TEMPLATE.workload("mimo-n128-p64-r1")
    assert "C = chunk_rows / R" in (space.check(space.default.replace(chunk_rows=128), shape) or "")
    assert "register" in (space.check(space.default.replace(num_warps=2), TEMPLATE.workload(
        "mimo-n256-p64-r4")) or "")
    assert space.check(space.default.replace(variant="fused", scan_block=1024), shape) is not None
    assert space.check(space.default.replace(block_n=32), TEMPLATE.workload("mimo-n32-p64-r4")) is not None


def test_inputs_are_reproducible_nonzero_and_typed():
    shape = tiny()
    a, b = TEMPLATE.make_inputs(shape, "cpu", 7), TEMPLATE.make_inputs(shape, "cpu", 7)
    c = TEMPLATE.make_inputs(shape, "cpu", 8)
    for name, x in a.items():
        assert torch.equal(x, b[name]) and x.is_contiguous()
        assert x.abs().sum() > 0, name
    assert not torch.equal(a["Q"], c["Q"])
    assert a["Q"].dtype == a["V"].dtype == a["Trap"].dtype == a["dOut"].dtype == torch.bfloat16
    assert a["ADT"].max() <= 0 and a["DT"].min() > 0
    assert a["AnglesCS"].shape == a["Angles"].shape == (1, 32, 2, 4)


def test_outputs_have_the_tilelang_dtypes_and_reference_shapes():
    shape = tiny()
    inputs = TEMPLATE.make_inputs(shape, "cpu", 0)
    outs = TEMPLATE.allocate_outputs(shape, inputs)
    refs = TEMPLATE.reference(shape, inputs)
    assert set(outs) == set(refs) == {o.name for o in TEMPLATE.outputs}
    for name, out in outs.items():
        assert out.shape == refs[name].shape == inputs[name[1:]].shape
        assert out.dtype == (torch.bfloat16 if name in LOWP_OUTPUTS else torch.float32), name
        assert refs[name].dtype == torch.float32


def test_default_config_passes_the_output_bounds_at_a_reduced_workload(device):
    shape = TEMPLATE.reduced(TEMPLATE.workload("mimo-n16-p64-r4"))
    inputs = TEMPLATE.make_inputs(shape, device, 3)
    outs = TEMPLATE.allocate_outputs(shape, inputs)
    for v in outs.values():
        v.fill_(float("nan"))
    TEMPLATE.build(TEMPLATE.space().default, shape)(inputs, outs)
    errs = errors(outs, TEMPLATE.reference(shape, inputs))
    bounds = {o.name: o.rtol for o in TEMPLATE.outputs}
    assert all(errs[k] <= bounds[k] for k in errs), errs


def test_comparator_reports_why_it_cannot_run_here():
    (cmp,) = TEMPLATE.comparators()
    assert cmp.name == "tilelang"
    shape = TEMPLATE.workload("mimo-n128-p64-r4")
    if not torch.cuda.is_available():
        assert cmp.unavailable(shape) == "needs a CUDA device"
    assert tl_cmp.settings(shape) == (16, 256)
    assert tl_cmp.settings(TEMPLATE.workload("mimo-n16-p64-r4")) == (8, 128)
    assert tl_cmp.settings(tiny(N=64, P=32, R=2)) == (32, 256)


def test_roofline_figures_and_registration():
    shape = TEMPLATE.workload("mimo-n128-p64-r4")
    assert TEMPLATE.bytes_moved(shape) > 4 * 2048 * 16 * 64 * 2 * 5
    assert TEMPLATE.flops(shape) > 0
    assert isinstance(registry.load("tuner.kernels.mamba3_mimo.bwd_template:Mamba3MimoBwd"), Mamba3MimoBwd)


def test_compile_at_batch_one_runs_a_batch_one_plan(device):
    # precompile() compiles on a GPU by this one run; a plan made for the full batch would index past the
    # batch-1 inputs (the bug that made every H200 precompile fault with an illegal address).
    shape = tiny(B=3, S=16)
    config = TEMPLATE.space().validate_config({**TEMPLATE.space().default.to_dict(), "chunk_rows": 16})
    TEMPLATE.compile_at_batch_one(config, shape, device)


def test_register_cap_fits_the_register_file_at_every_cta_size():
    from tuner.kernels.mamba3_mimo.bwd_launch import register_cap

    for warps in (1, 2, 4, 8, 16, 32):
        cap = register_cap(warps)
        assert cap <= 255 and cap * 32 * warps <= 65536 and (cap % 8 == 0 or cap == 255)
    assert register_cap(4) == 255 and register_cap(16) == 128


def test_every_carried_version_completes_configs_into_the_current_space():
    """A template's carried versions (tuner.spec.CarriedVersion) add only parameters of its space, with values
    of their domains; MIMO version 4 carries version 3 (with qk_warps=same) and version 2 (with the scan)."""
    from tuner import registry
    from tuner.errors import TunerError

    for name in registry.names():
        try:
            spec = registry.spec(name)
        except TunerError:  # other tests register templates that resolve only for them (in the full suite)
            continue
        if not spec.carries:  # nor do their space files always exist here
            continue
        space = spec.space()
        for carried in spec.carries:
            assert carried.version != spec.version
            for param, value in carried.added:
                assert param in space.names and space.param(param).contains(value), (name, param, value)
    carried = [(c.version, c.added) for c in registry.spec("mamba3_mimo_bwd").carries]
    assert carried == [("3", (("qk_warps", "same"),)), ("2", (("state_pass", "scan"), ("qk_warps", "same")))]
    # every version-2 and version-3 best of the committed H200 store is a current config once completed by its
    # carried version, valid for its shape
    import sqlite3
    from pathlib import Path

    spec = registry.spec("mamba3_mimo_bwd")
    space = spec.space()
    store = Path(__file__).resolve().parents[3] / "benchmarks" / "h200" / "mamba3_mimo_bwd.db"
    for carried in spec.carries:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT m.config_json, s.shape_json FROM tuner_best_configs b JOIN tuner_studies s"
                " ON s.id = b.study_id JOIN tuner_measurements m ON m.id = b.measurement_id"
                " WHERE s.template_version = ?", (carried.version,)).fetchall()
        assert len(rows) >= 11, carried.version
        for config_json, shape_json in rows:
            config = space.validate_config(carried.config(json.loads(config_json)))
            assert space.is_valid(config, spec.make_shape(json.loads(shape_json))), config_json


@pytest.mark.parametrize(("seqlen", "steps"), [(2048, (32, 128)), (96, (32, 32)), (8000, (32, 800)), (24, (8, 8)),
                                               (64, (32, 32)), (16, (16, 16))])
def test_the_epilogue_runs_the_most_segments_of_whole_blocks(seqlen, steps):
    """(block, segment) of the epilogue: at most 16 segments per (b, h), each a whole number of blocks, as many
    as divide S (a gcd with 16 left S = 96 at one latency-bound program per (b, h))."""
    from tuner.kernels.mamba3_mimo.bwd_launch import EPILOGUE_SEGMENTS, epilogue_steps

    block, segment = epilogue_steps(seqlen)
    assert (block, segment) == steps
    assert seqlen % segment == 0 and segment % block == 0 and seqlen // segment <= EPILOGUE_SEGMENTS
