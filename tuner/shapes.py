"""Turning user input (workload names, ``B=1,S=4096`` strings) into validated shapes of a template."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.errors import ShapeError, UserInputError
from tuner.frozen import Shape
from tuner.spec import TemplateSpec
from tuner.template import KernelTemplate


def parse_shape_text(text: str) -> dict[str, str]:
    """``"B=1,S=4096,H=48"`` → ``{"B": "1", ...}``; ShapeError on malformed text (types are checked later)."""
    raw: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ShapeError(f"malformed shape {text!r}: expected NAME=VALUE pairs separated by commas")
        if name.strip() in raw:
            raise ShapeError(f"malformed shape {text!r}: {name.strip()} given twice")
        raw[name.strip()] = value.strip()
    if not raw:
        raise ShapeError("empty shape: expected NAME=VALUE pairs such as B=1,S=4096,H=48")
    return raw


def select_shapes(
    template: TemplateSpec | KernelTemplate,
    *,
    workloads: Sequence[str] = (),
    shapes: Sequence[str] = (),
    all_workloads: bool = False,
) -> list[tuple[str, Shape]]:
    """(label, shape) pairs in the given order, duplicates removed; UserInputError when nothing is selected."""
    selected: list[tuple[str, Shape]] = []
    names = [w.name for w in template.workloads] if all_workloads else list(workloads)
    for name in names:
        selected.append((name, template.workload(name)))
    for text in shapes:
        shape = template.make_shape(parse_shape_text(text))
        selected.append((template.workload_name(shape) or shape.key(), shape))
    if not selected:
        raise UserInputError("give at least one --workload, --shape or --all-workloads")
    unique: dict[Shape, str] = {}
    for label, shape in selected:
        unique.setdefault(shape, label)
    return [(label, shape) for shape, label in unique.items()]
