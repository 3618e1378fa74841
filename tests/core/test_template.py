from __future__ import annotations

import pytest

from tuner import registry
from tuner.errors import ShapeError, TemplateImportError, UnknownTemplateError, UnknownWorkloadError
from tuner.frozen import Shape
from tuner.template import Dim, KernelTemplate, OutputSpec, ShapeRule, Workload


class _Toy(KernelTemplate):
    name = "toy"
    version = "1"
    backend = "triton"
    dims = (
        Dim("S"),
        Dim("Q", default=256),
        Dim("has_bias", kind="bool", default=False),
        Dim("dtype", kind="str", default="float16", choices=("float16", "bfloat16")),
    )
    outputs = (OutputSpec("y"),)
    workloads = (Workload("small", {"S": 512}), Workload("biased", {"S": 1024, "has_bias": True}))

    shape_rules = (ShapeRule("S % Q == 0", "S={S} is not a multiple of the chunk Q={Q}"),)

    def make_inputs(self, shape, device, seed):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def reference(self, shape, inputs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def allocate_outputs(self, shape, inputs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def build(self, config, shape):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def bytes_moved(self, shape: Shape) -> int:
        return 0


def test_make_shape_coerces_fills_defaults_and_checks() -> None:
    t = _Toy()
    shape = t.make_shape({"S": "0x200", "has_bias": "yes"})
    assert shape == Shape(S=512, Q=256, has_bias=True, dtype="float16")
    assert t.workload("small") == Shape(S=512, Q=256, has_bias=False, dtype="float16")
    assert t.workload_name(t.make_shape({"S": 1024, "has_bias": 1})) == "biased"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"S": 500}, "S=500 is not a multiple of the chunk Q=256"),
        ({"S": "four"}, "shape dim S: expected an integer"),
        ({"S": 512.5}, "shape dim S: expected an integer"),
        ({"S": 0}, "shape dim S: must be >= 1"),
        ({"S": True}, "shape dim S: expected an integer"),
        ({}, "shape dim S is required"),
        ({"S": 512, "X": 1}, "unknown shape dim(s) X"),
        ({"S": 512, "dtype": "int8"}, "expected one of float16, bfloat16"),
        ({"S": 512, "has_bias": "maybe"}, "expected true/false"),
    ],
)
def test_bad_shapes_name_the_problem(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ShapeError) as info:
        _Toy().make_shape(raw)
    assert message in str(info.value)


def test_unknown_workload_lists_known_ones() -> None:
    with pytest.raises(UnknownWorkloadError, match="known: small, biased"):
        _Toy().workload("huge")


def test_registry_is_explicit_and_lazy() -> None:
    registry.register("toy", f"{__name__}:_Toy")
    assert registry.get("toy").name == "toy"
    assert "toy" in registry.names()
    registry.register("toy-alias", f"{__name__}:_Toy")
    with pytest.raises(UnknownTemplateError, match="whose name is 'toy'"):
        registry.get("toy-alias")
    with pytest.raises(UnknownTemplateError, match="unknown template 'nope'"):
        registry.get("nope")
    with pytest.raises(TemplateImportError, match="not a KernelTemplate"):
        registry.load(f"{__name__}:test_registry_is_explicit_and_lazy")


def test_a_template_that_does_not_import_is_named_in_one_clear_error() -> None:
    registry.register("toy-missing-class", f"{__name__}:NoSuchTemplate")
    registry.register("toy-missing-module", "tests.no_such_module:Toy")
    try:
        missing_class = r"template 'toy-missing-class': cannot import .*has no 'NoSuchTemplate'"
        with pytest.raises(TemplateImportError, match=missing_class):
            registry.get("toy-missing-class")
        with pytest.raises(TemplateImportError, match=r"cannot import tests.no_such_module:Toy: No module named"):
            registry.spec("toy-missing-module")
        with pytest.raises(ImportError):  # still an ImportError for callers that load paths of their own
            registry.load("tests.no_such_module:Toy")
    finally:
        registry.unregister("toy-missing-class")
        registry.unregister("toy-missing-module")
    assert "toy-missing-class" not in registry.names()
