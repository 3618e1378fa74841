from __future__ import annotations

import math
from typing import Any

import pytest

from tuner import registry
from tuner.distance import DEFAULT_DISTANCE, ShapeDistance, learn_weights
from tuner.frozen import Config, Shape
from tuner.lookup import (
    MIN_GAIN,
    NEAR_DISTANCE,
    REPAIR_CHECKS,
    ConfigChange,
    Difference,
    Domain,
    Entry,
    Requester,
    choose,
    repair_config,
    required_gain,
    shape_distance,
)


def _entry(S: int, H: int, dtype: str = "float16", config: int = 0, at: str = "2026-01-01T00:00:00", dev: str = "H200"):
    return Entry("t", "1", {"S": S, "H": H, "dtype": dtype}, "cuda", dev, {"BLOCK_H": config}, 1.0, published_at=at)


def test_distance_is_log2_ratio_sum_plus_a_doubling_per_dtype_or_flag_difference() -> None:
    assert shape_distance({"S": 4096, "H": 48}, {"S": 4096, "H": 48}) == 0
    assert shape_distance({"S": 4096, "H": 48}, {"S": 2048, "H": 96}) == 2.0
    assert shape_distance({"S": 1, "d": "float16"}, {"S": 1, "d": "bfloat16"}) == 1.0  # same width
    assert math.isinf(shape_distance({"S": 1, "d": "float16"}, {"S": 1, "d": "float32"}))  # not
    assert shape_distance({"S": 2, "bias": True}, {"S": 1, "bias": False}) == 2.0
    assert math.isinf(shape_distance({"S": 1}, {"S": 1, "H": 2}))
    assert math.isinf(shape_distance({"S": 0}, {"S": 1}))


def test_exact_then_nearest_then_default() -> None:
    entries = [_entry(4096, 48, config=1), _entry(32768, 80, config=2)]
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "exact" and a.config == {"BLOCK_H": 1} and a.distance == 0
    a = choose({"S": 8192, "H": 48, "dtype": "float16"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "nearest" and a.config == {"BLOCK_H": 1} and a.distance == 1.0
    a = choose({"S": 8192, "H": 48, "dtype": "float32"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "default" and a.config == {"BLOCK_H": 9} and a.entry is None
    # a default says why (before: no note at all, where a far shape's default had one)
    assert a.notes == ("2 entries of shapes not comparable with this one (they differ in a dim that no config "
                       "is served across, e.g. a dtype of another width)",)
    none = choose({"S": 8192, "H": 48, "dtype": "float32"}, [], default={"BLOCK_H": 9})
    assert none is not None and none.notes == ("no best config published for this template here yet: its "
                                               "default (a tuning job of this shape publishes one)",)
    assert choose({"S": 8192, "H": 48, "dtype": "float32"}, entries, default=None) is None
    a = choose({"S": 8192, "H": 48, "dtype": "bfloat16"}, entries, default=None)  # equal width: near
    assert a is not None and a.match == "nearest" and a.distance == 2.0 and a.config == {"BLOCK_H": 1}


def test_another_shapes_config_that_barely_beat_its_default_there_is_not_served() -> None:
    """The gain gate (MIN_GAIN): a neighbour's config that ran within 5% of the default on its own shape is
    no evidence for this one (benchmarks/regret.md, "The gain gate, varied"): the next entry, else the default,
    with a note. The shape's own entry, an entry whose config is the default, and (up to NEAR_DISTANCE)
    entries without a default figure are served as before."""
    default = {"BLOCK_H": 9}

    def gained(S: int, config: int, default_us: float | None, at: str = "2026-01-01") -> Entry:
        return Entry("t", "1", {"S": S, "H": 48, "dtype": "float16"}, "cuda", "H200", {"BLOCK_H": config}, 1.0,
                     published_at=at, default_us=default_us)

    near, far = gained(8192, 1, 1.02), gained(32768, 2, 1.30)
    assert near.gain == pytest.approx(0.02) and far.gain == pytest.approx(0.30) and gained(1, 1, None).gain is None
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [near, far], default=default)
    assert a is not None and a.match == "nearest" and a.config == {"BLOCK_H": 2} and a.entry is far
    assert a.notes and "ran only +2.0% faster than the default there" in a.notes[0]
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [near], default=default)
    assert a is not None and a.match == "default" and a.config == default
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [near], default=default, min_gain=0.0)  # gate off
    assert a is not None and a.match == "nearest" and a.config == {"BLOCK_H": 1}
    a = choose({"S": 8192, "H": 48, "dtype": "float16"}, [near], default=default)  # its own shape: exact
    assert a is not None and a.match == "exact" and a.config == {"BLOCK_H": 1}
    for kept in (gained(8192, 9, 1.0), gained(8192, 1, None)):  # the default itself; no figure: as before
        a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [kept], default=default)
        assert a is not None and a.match == "nearest" and a.entry is kept
    assert Entry.from_dict(near.to_dict()) == near  # the export file's round trip
    assert Entry.from_dict({k: v for k, v in near.to_dict().items() if k != "default_us"}).gain is None


def test_beyond_the_near_distance_the_gain_asked_grows_entries_need_a_figure_and_rank_after_near_ones() -> None:
    """Up to NEAR_DISTANCE (3) the lookup works as it did when nothing farther was served: the flat gate
    (MIN_GAIN), entries without a default figure served. Beyond it an entry must have gained MIN_GAIN × d / 3 over
    the default on its own shape (6.67% at 4, 10% at 6), is not served without a figure, and ranks after every
    nearer entry even when the nearer one was measured under another device name or software (before, the cap
    at 3 bounded that jump). The default distance caps at 6."""
    assert (MIN_GAIN, NEAR_DISTANCE, DEFAULT_DISTANCE.max_distance) == (0.05, 3.0, 6.0)
    assert [required_gain(d) for d in (0.0, 1.0, 3.0, 4.0, 4.5, 6.0)] == pytest.approx(
        [0.05, 0.05, 0.05, 0.05 * 4 / 3, 0.075, 0.10])
    assert required_gain(10.0, 0.05, math.inf) == 0.05  # near_distance inf: the flat gate
    with pytest.raises(ValueError, match="near_distance must be positive"):
        required_gain(1.0, 0.05, 0.0)
    default, here = {"BLOCK_H": 9}, {"S": 4096, "H": 48, "dtype": "float16"}

    def at(doublings: int, config: int, default_us: float | None, published: str = "2026-01-01",
           torch: str = "2.5") -> Entry:
        return Entry("t", "1", {"S": 4096 << doublings, "H": 48, "dtype": "float16"}, "cuda", "H200",
                     {"BLOCK_H": config}, 1.0, published_at=published, default_us=default_us,
                     software={"torch": torch})

    plain = ShapeDistance("plain")  # a doubling costs 1: the distances are the doublings; no cap
    three_6, four_6, four_8, six_9, six_12 = (at(3, 1, 1.06), at(4, 2, 1.06), at(4, 3, 1.08), at(6, 4, 1.09),
                                              at(6, 5, 1.12))
    a = choose(here, [three_6], default=default, distance=plain)
    assert a is not None and a.entry is three_6 and a.distance == 3.0  # 6% ≥ 5% at 3
    a = choose(here, [four_6, four_8, six_12], default=default, distance=plain)
    assert a is not None and a.entry is four_8 and a.config == {"BLOCK_H": 3}  # 8% ≥ 6.67% at 4; 6% is not
    assert any("ran only +6.0% faster than the default there (< 6.67% asked at distance 4" in n for n in a.notes)
    a = choose(here, [four_6, six_9, six_12], default=default, distance=plain)
    assert a is not None and a.entry is six_12  # 9% < 10% at 6: the next one
    a = choose(here, [four_6, six_9], default=default, distance=plain)
    assert a is not None and a.match == "default" and a.config == default and len(a.notes) == 2
    assert choose(here, [six_9], default=default, distance=plain, near_distance=math.inf).entry is six_9
    far = choose(here, [at(7, 5, 1.12)], default=default)  # 7 doublings (11.7% asked): beyond the default's cap…
    assert far is not None and far.match == "default" and any("farther than 6" in n for n in far.notes)
    assert choose(here, [at(6, 5, 1.12)], default=default).config == {"BLOCK_H": 5}  # …6 are not
    with pytest.raises(ValueError, match="near_distance must be positive"):
        choose(here, [six_12], default=default, near_distance=-1.0)
    # Without a default figure: served at 3, not at 4 (the entry at 4 is more recent, but skipped, said so).
    three_none, four_none = at(3, 5, None), at(4, 6, None, "2026-02-01")
    a = choose(here, [four_none, three_none], default=default, distance=plain)
    assert a is not None and a.entry is three_none
    a = choose(here, [four_none], default=default, distance=plain)
    assert a is not None and a.match == "default" and "no default figure" in a.notes[0]
    # No template default: nothing to weigh a gain against, an entry without a figure is served however far.
    a = choose(here, [four_none], default=None, distance=plain)
    assert a is not None and a.match == "nearest" and a.entry is four_none
    # The requester's software first within 3 (as always: an entry 2 away beats the shape's own under other
    # software), but an entry beyond 3 never outranks a nearer one: the shape's own, answered as foreign.
    own_old = Entry("t", "1", dict(here), "cuda", "H200", {"BLOCK_H": 7}, 1.0, published_at="2026-01-01",
                    default_us=1.5, software={"torch": "2.4"})
    who = Requester(software={"torch": "2.5"})
    a = choose(here, [own_old, at(2, 1, 1.40)], default=default, requester=who, distance=plain)
    assert a is not None and a.config == {"BLOCK_H": 1}
    a = choose(here, [own_old, at(5, 1, 1.40)], default=default, requester=who, distance=plain)
    assert a is not None and a.entry is own_old and a.foreign and a.match == "nearest"


def test_nearest_skips_configs_invalid_for_the_requested_shape() -> None:
    entries = [_entry(4096, 64, config=64), _entry(4096, 8, config=8)]
    a = choose({"S": 4096, "H": 32, "dtype": "float16"}, entries, default={"BLOCK_H": 1},
               valid=lambda c, s: c["BLOCK_H"] <= s["H"])
    assert a is not None and a.match == "nearest" and a.config == {"BLOCK_H": 8}
    assert a.notes and "invalid for this shape" in a.notes[0]


def test_ties_go_to_the_most_recent_and_device_name_is_preferred() -> None:
    old, new = _entry(4096, 48, config=1, at="2026-01-01"), _entry(4096, 48, config=2, at="2026-02-01")
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [old, new], default=None)
    assert a is not None and a.config == {"BLOCK_H": 2}
    other = _entry(4096, 48, config=3, dev="A100", at="2026-03-01")
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [old, other], default=None, device_name="H200")
    assert a is not None and a.config == {"BLOCK_H": 1}


def _sw(triton: str, dev: str = "H200", S: int = 4096, config: int = 0, at: str = "2026-01-01") -> Entry:
    return Entry("t", "1", {"S": S, "H": 48, "dtype": "float16"}, "cuda", dev, {"BLOCK_H": config}, 1.0,
                 published_at=at, software={"driver": "580", "runtime": "13.0", "torch": "2.9", "triton": triton,
                                            "tilelang": "0.1"})


def test_the_requesters_device_then_software_are_preferred_over_a_nearer_shape() -> None:
    shape = {"S": 4096, "H": 48, "dtype": "float16"}
    same_shape_old = _sw("3.4", config=1)
    near_shape_ours = _sw("3.5", S=8192, config=2)
    other_device = _sw("3.5", dev="A100", config=3)
    me = Requester("H200", {"triton": "3.5", "torch": "2.9"}, backend="triton")
    a = choose(shape, [same_shape_old, near_shape_ours, other_device], default=None, requester=me)
    assert a is not None and a.config == {"BLOCK_H": 2} and a.match == "nearest" and not a.foreign
    assert a.differences == (Difference("shape.S", 4096, 8192),)
    a = choose(shape, [same_shape_old, other_device], default=None, requester=me)
    assert a is not None and a.config == {"BLOCK_H": 1} and a.match == "nearest" and a.foreign
    assert a.differences == (Difference("triton", "3.5", "3.4"),)
    a = choose(shape, [other_device], default=None, requester=me)
    assert a is not None and a.match == "nearest" and a.differences == (Difference("device_name", "H200", "A100"),)
    # A library the template's backend does not use is not compared; one the entry lacks is a difference.
    tl = Requester("H200", {"triton": "3.4", "tilelang": "9"}, backend="triton")
    assert choose(shape, [same_shape_old], default=None, requester=tl).match == "exact"  # type: ignore[union-attr]
    unknown = choose(shape, [Entry("t", "1", shape, "cuda", "H200", {"BLOCK_H": 4})], default=None,
                     requester=Requester("H200", {"triton": "3.4"}))
    assert unknown is not None and unknown.differences == (Difference("triton", "3.4", None),)
    # Nothing given: nothing compared, as before fingerprints were compared; a template version bump is never exact.
    a = choose(shape, [same_shape_old], default=None)
    assert a is not None and a.match == "exact" and a.unchecked == ("device_name", "software")
    a = choose(shape, [same_shape_old], default=None, requester=Requester(template_version="2"))
    assert a is not None and a.match == "nearest" and a.differences == (Difference("template_version", "2", "1"),)


def test_weights_are_learnt_from_how_much_each_dims_changes_change_the_best_config() -> None:
    # Along N the best config never changes, along P one of two parameters does, along R both do.
    examples = [
        ({"N": 64, "P": 64, "R": 4}, {"rows": 32, "warps": 2}),
        ({"N": 128, "P": 64, "R": 4}, {"rows": 32, "warps": 2}),
        ({"N": 256, "P": 64, "R": 4}, {"rows": 32, "warps": 2}),
        ({"N": 128, "P": 128, "R": 4}, {"rows": 32, "warps": 4}),
        ({"N": 128, "P": 64, "R": 8}, {"rows": 64, "warps": 4}),
    ]
    weights = learn_weights(examples, floor=0.1)
    assert weights == pytest.approx({"N": 0.1, "P": 1.0, "R": 2.0})  # averages 0, 1/2, 1 over their mean 1/2
    # Nothing differs in one dim only, or no change changed a config: nothing learnt.
    assert learn_weights([({"N": 1, "P": 1}, {"a": 1}), ({"N": 2, "P": 2}, {"a": 2})]) == {}
    assert learn_weights([({"N": 1}, {"a": 1}), ({"N": 2}, {"a": 1})]) == {}
    learnt = ShapeDistance("t", learn=True).fitted(examples)
    # From N=128,P=64,R=4: N=64 (0.1) is nearer than P=128 (1.0), which is nearer than R=8 (2.0).
    assert learnt({"N": 128, "P": 64, "R": 4}, {"N": 64, "P": 64, "R": 4}) == pytest.approx(0.1)
    assert learnt({"N": 128, "P": 64, "R": 4}, {"N": 128, "P": 64, "R": 8}) == pytest.approx(2.0)
    assert ShapeDistance("t").fitted(examples) == ShapeDistance("t")  # learn unset: unchanged


def test_the_lookup_fits_its_distance_over_the_entries_and_serves_nothing_beyond_max_distance() -> None:
    def entry(n: int, p: int, rows: int, warps: int, at: str) -> Entry:
        return Entry("t", "1", {"N": n, "P": p}, "cuda", "H200", {"rows": rows, "warps": warps}, published_at=at)

    # N changes leave the config alone, P changes change it: a request at N=128,P=64 gets N=64,P=64's config,
    # although N=128,P=128's entry is as many doublings away and more recent.
    entries = [entry(64, 64, 32, 2, "2026-01-01"), entry(32, 64, 32, 2, "2026-01-01"),
               entry(64, 128, 64, 4, "2026-01-01"), entry(128, 128, 64, 4, "2026-01-02")]
    learnt = ShapeDistance("learnt", learn=True, max_distance=3.0)
    a = choose({"N": 128, "P": 64}, entries, default={"rows": 16, "warps": 8}, distance=learnt)
    assert a is not None and a.config == {"rows": 32, "warps": 2} and a.entry is entries[0]
    assert a.distance == pytest.approx(0.1)  # N weighs the floor, P 2
    plain = choose({"N": 128, "P": 64}, entries, default={"rows": 16, "warps": 8}, distance=ShapeDistance("plain"))
    assert plain is not None and plain.config == {"rows": 64, "warps": 4}  # the tie went to the most recent
    # 3 doublings of P (weight 2) from the nearest entry: beyond max_distance, the default is served, said so.
    far = choose({"N": 128, "P": 1024}, entries, default={"rows": 16, "warps": 8}, distance=learnt)
    assert far is not None and far.match == "default" and far.config == {"rows": 16, "warps": 8}
    assert any("farther than 3" in n for n in far.notes)
    assert choose({"N": 128, "P": 1024}, entries, default=None, distance=learnt) is None


def test_the_size_term_counts_the_product_of_the_integer_dims() -> None:
    size = ShapeDistance("size", size_weight=1.0, dim_weight=0.0)
    assert size({"B": 2, "S": 1024}, {"B": 1, "S": 2048}) == 0.0  # the same number of elements
    assert size({"B": 2, "S": 1024}, {"B": 1, "S": 1024}) == 1.0
    assert DEFAULT_DISTANCE.max_distance == 6.0 and DEFAULT_DISTANCE.learn


# -- config repair, over the real Mamba3 MIMO backward search space -------------------------------------------
# The R=4 best of the H200 store (split2, 32 rows, 2 warps): for R=16, C = 32/16 = 2 steps (fewer than 4), and
# 64 rows need 4 warps' registers (valid for R=8 since the space allows 4-step chunks).
MIMO_R4_BEST = {"variant": "split2", "chunk_rows": 32, "block_n": 16, "prec": "lowp3", "prec_rot": "lowp3",
                "num_warps": 2, "num_stages": 2, "scan_block": 512, "scan_chunks": 4, "group_chunks": 4,
                "state_pass": "scan", "qk_warps": "same"}


def _mimo() -> tuple[Any, Any]:
    spec = registry.spec("mamba3_mimo_bwd")
    return spec, spec.space()


def _mimo_shape(spec: Any, **dims: int) -> dict[str, Any]:
    return dict(spec.make_shape({"B": 4, "S": 2048, "H": 16, "N": 128, "P": 64, "R": 4, **dims}).to_dict())


def _mimo_entry(shape: dict[str, Any], config: dict[str, Any], at: str = "2026-01-01") -> Entry:
    return Entry("mamba3_mimo_bwd", "2", shape, "cuda", "NVIDIA H200", config, 1000.0, published_at=at)


def test_an_invalid_nearest_config_is_repaired_with_the_smallest_valid_change() -> None:
    spec, space = _mimo()
    r16 = _mimo_shape(spec, R=16)
    entries = [_mimo_entry(_mimo_shape(spec, N=n), MIMO_R4_BEST) for n in (64, 128, 256)]
    default = space.default.to_dict()
    assert not space.constraint_check(MIMO_R4_BEST, r16)
    # Without domains (as before repairs): every neighbour is skipped and the default is served.
    skipped = choose(r16, entries, default=default, valid=space.constraint_check)
    assert skipped is not None and skipped.match == "default" and skipped.repaired == ()
    a = choose(r16, entries, default=default, valid=space.constraint_check, domains=space.domains)
    assert a is not None and a.match == "nearest" and a.entry is entries[1] and a.distance is not None
    assert a.config == {**MIMO_R4_BEST, "chunk_rows": 64, "num_warps": 4}
    assert a.repaired == (ConfigChange("chunk_rows", 32, 64), ConfigChange("num_warps", 2, 4))
    assert space.is_valid(Config(a.config), Shape(r16))
    assert any("repaired" in n and "chunk_rows 32 → 64" in n and "num_warps 2 → 4" in n for n in a.notes)
    # With 4 warps already, one change does: the cheapest (a doubling of chunk_rows, not a jump to 128).
    four = {**MIMO_R4_BEST, "num_warps": 4}
    a = choose(r16, [_mimo_entry(_mimo_shape(spec), four)], default=default, valid=space.constraint_check,
               domains=space.domains)
    assert a is not None and a.config == {**four, "chunk_rows": 64}
    assert a.repaired == (ConfigChange("chunk_rows", 32, 64),)
    # A valid config is served as it is (no repair), and the exact entry stays exact.
    a = choose(_mimo_shape(spec), entries, default=default, valid=space.constraint_check, domains=space.domains)
    assert a is not None and a.match == "exact" and a.config == MIMO_R4_BEST and a.repaired == ()


def test_repairs_are_deterministic_cheapest_first_and_bounded() -> None:
    spec, space = _mimo()
    r16 = _mimo_shape(spec, R=16)
    # A plain callable (no constraint names to prune with) finds the same repair, with more checks.
    plain = lambda c, s: space.is_valid(Config(c), Shape(s))  # noqa: E731
    pruned_budget, plain_budget = [1000], [1000]
    pruned = repair_config(MIMO_R4_BEST, r16, space.domains, space.constraint_check, budget=pruned_budget)
    assert pruned == repair_config(MIMO_R4_BEST, r16, space.domains, plain, budget=plain_budget)
    assert pruned is not None and 1000 - pruned_budget[0] < 1000 - plain_budget[0]
    assert 1000 - pruned_budget[0] <= REPAIR_CHECKS
    # Out of budget: no repair (the lookup then skips the entry, as before repairs, and says so).
    assert repair_config(MIMO_R4_BEST, r16, space.domains, space.constraint_check, budget=[1]) is None
    # No change of one parameter or two neighbouring values mends chunk_rows=16 at R=16 with 2 warps (C=1):
    hopeless = {**MIMO_R4_BEST, "chunk_rows": 16}
    assert repair_config(hopeless, r16, space.domains, space.constraint_check) is None
    a = choose(r16, [_mimo_entry(_mimo_shape(spec), hopeless)], default=space.default.to_dict(),
               valid=space.constraint_check, domains=space.domains)
    assert a is not None and a.match == "default" and any("invalid for this shape" in n for n in a.notes)
    # One change when one does, else two; ties go to the domains' order (BLOCK_A before BLOCK_B).
    domains = (Domain("BLOCK_A", "pow2", (1, 2, 4, 8)), Domain("BLOCK_B", "pow2", (1, 2, 4, 8)),
               Domain("mode", "categorical", ("x", "y")))
    fits = lambda c, s: c["BLOCK_A"] + c["BLOCK_B"] <= s["n"] and c["mode"] == "x"  # noqa: E731
    assert repair_config({"BLOCK_A": 8, "BLOCK_B": 8, "mode": "x"}, {"n": 8}, domains, fits) == (
        {"BLOCK_A": 4, "BLOCK_B": 4, "mode": "x"}, (ConfigChange("BLOCK_A", 8, 4), ConfigChange("BLOCK_B", 8, 4)))
    assert repair_config({"BLOCK_A": 4, "BLOCK_B": 4, "mode": "x"}, {"n": 6}, domains, fits) == (
        {"BLOCK_A": 2, "BLOCK_B": 4, "mode": "x"}, (ConfigChange("BLOCK_A", 4, 2),))
    assert repair_config({"BLOCK_A": 1, "BLOCK_B": 1, "mode": "y"}, {"n": 6}, domains, fits) == (
        {"BLOCK_A": 1, "BLOCK_B": 1, "mode": "x"}, (ConfigChange("mode", "y", "x"),))


def test_the_fitted_distance_does_not_depend_on_the_order_of_the_entries_and_is_fitted_once() -> None:
    from tuner.lookup import fit_distance

    def entry(n: int, p: int, rows: int, device: str, at: str) -> Entry:
        return Entry("t", "1", {"N": n, "P": p}, "cuda", device, {"rows": rows}, published_at=at)

    # One shape (N=64,P=64) has bests on two device names with different configs: which one pairs with its
    # neighbours along N and P must not depend on the list's order (the latest one does).
    entries = [entry(64, 64, 32, "H100", "2026-01-01"), entry(64, 64, 64, "H200", "2026-01-02"),
               entry(128, 64, 64, "H200", "2026-01-01"), entry(64, 128, 32, "H200", "2026-01-01")]
    learnt = ShapeDistance("learnt", learn=True)
    forward, backward = fit_distance(learnt, entries), fit_distance(learnt, entries[::-1])
    assert forward == backward and forward.fitted_on == 3  # one example per shape
    # The latest N=64,P=64 best (rows 64) equals N=128's and differs from P=128's: only P changed a config.
    assert forward.weights == pytest.approx({"N": 0.1, "P": 2.0})
    # Fitted for good: fitting again (e.g. inside choose) changes nothing, whatever the entries.
    assert fit_distance(forward, entries[:1]) is forward and forward.fitted(entries[:1]) is forward
    a = choose({"N": 128, "P": 128}, entries, default={"rows": 16}, distance=forward)
    b = choose({"N": 128, "P": 128}, entries[::-1], default={"rows": 16}, distance=learnt)
    assert a is not None and b is not None and (a.config, a.distance) == (b.config, b.distance)
