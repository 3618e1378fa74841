"""The explicit registry of kernel templates: name → import path of its spec or its class.

A built-in template is registered by its :class:`tuner.spec.TemplateSpec` (``module:SPEC``), which names
the implementation: :func:`spec` reads it without importing torch, Triton or TileLang (the API process
does only that), :func:`get` imports the implementation (workers and measurement processes). Importing
kernels lazily matters too because the CPU backend must set ``TRITON_INTERPRET=1`` before Triton is first
imported. Measurement subprocesses receive the import path, so templates registered at run time (tests,
plugins) work there too.

Templates of your own, outside this repository: ``TUNER_TEMPLATES="name=pkg.module:Class,other=…"`` (a
KernelTemplate class or a TemplateSpec) adds them to the registry of every tuner process (CLI, server,
workers) that sees the variable.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from functools import cache
from typing import TypeVar

from tuner.errors import TemplateImportError, UnknownTemplateError
from tuner.spec import TemplateSpec
from tuner.template import KernelTemplate

BUILTIN_TEMPLATES: dict[str, str] = {
    "mamba2_chunk_cumsum": "tuner.kernels.mamba2_chunk_cumsum.spec:TRITON",
    "mamba2_chunk_cumsum_tilelang": "tuner.kernels.mamba2_chunk_cumsum.spec:TILELANG",
    "mamba3_mimo_bwd": "tuner.kernels.mamba3_mimo.spec:BWD",
}

_lock = threading.Lock()
T = TypeVar("T")


def _from_environment(text: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, ref = item.partition("=")
        if not sep or ":" not in ref:
            raise UnknownTemplateError(f"TUNER_TEMPLATES: expected name=package.module:Class, got {item!r}")
        entries[name.strip()] = ref.strip()
    return entries


_from_env = _from_environment(os.environ.get("TUNER_TEMPLATES", ""))
_registry: dict[str, str] = {**BUILTIN_TEMPLATES, **_from_env}


def register(name: str, ref: str) -> None:
    """Add (or replace) a template under ``name``; ``ref`` is ``package.module:Name`` of a KernelTemplate
    class or of a TemplateSpec."""
    with _lock:
        _registry[name] = ref


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (tests that registered a template of their own); no error if absent.
    The built-in templates and those of ``TUNER_TEMPLATES`` are removed too, until re-registered."""
    with _lock:
        _registry.pop(name, None)


def names() -> list[str]:
    with _lock:
        return sorted(_registry)


def ref_of(name: str) -> str:
    """The import path of a registered template; UnknownTemplateError if none."""
    with _lock:
        ref = _registry.get(name)
    if ref is None:
        raise UnknownTemplateError(f"unknown template {name!r}; known: {', '.join(names()) or 'none'}")
    return ref


def get(name: str) -> KernelTemplate:
    """The template registered under ``name`` (one shared instance per import path).

    Raises UnknownTemplateError when the name is not registered or names a template of another name
    (registry names and ``KernelTemplate.name`` are one and the same: the store keys studies by it).
    """
    template = _named(name, load)
    if template.name != name:
        raise UnknownTemplateError(
            f"template {name!r} is registered to {ref_of(name)}, whose name is {template.name!r}"
        )
    return template


def spec(name: str) -> TemplateSpec:
    """The spec of the template registered under ``name``, without importing a built-in implementation.

    Raises UnknownTemplateError as :func:`get` does, TemplateImportError as :func:`load`.
    """
    ref = ref_of(name)
    found = _named(name, _spec_or_template)
    the_spec = found if isinstance(found, TemplateSpec) else found.spec
    if the_spec.name != name:
        raise UnknownTemplateError(f"template {name!r} is registered to {ref}, whose name is {the_spec.name!r}")
    return the_spec


def _named(name: str, loader: Callable[[str], T]) -> T:
    """``loader(ref_of(name))``; a TemplateImportError names the template and, if it came from there,
    TUNER_TEMPLATES."""
    ref = ref_of(name)
    try:
        return loader(ref)
    except TemplateImportError as exc:
        where = " (from TUNER_TEMPLATES)" if _from_env.get(name) == ref else ""
        raise TemplateImportError(f"template {name!r}{where}: {exc}") from exc


@cache
def load(ref: str) -> KernelTemplate:
    """The template of an import path (``module:Class`` or ``module:SPEC``), one instance per path; raises
    TemplateImportError (an ImportError) when the module, the name or a template is not found there."""
    found = _spec_or_template(ref)
    return load(found.implementation) if isinstance(found, TemplateSpec) else found


@cache
def _spec_or_template(ref: str) -> TemplateSpec | KernelTemplate:
    module_name, _, attr = ref.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:  # the module, or one it imports, is missing
        raise TemplateImportError(f"cannot import {ref}: {exc}") from exc
    except AttributeError:
        raise TemplateImportError(f"cannot import {ref}: module {module_name} has no {attr!r}") from None
    if isinstance(obj, TemplateSpec):
        return obj
    if not (isinstance(obj, type) and issubclass(obj, KernelTemplate)):
        raise TemplateImportError(f"{ref} is not a KernelTemplate subclass (nor a TemplateSpec)")
    return obj()
