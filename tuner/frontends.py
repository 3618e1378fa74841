"""Backend-specific knowledge shared by templates: which exceptions are compile errors.

Triton and TileLang compile at the first launch (or at build), and report compile errors with their own
exception types; under the Triton interpreter a frontend rejection surfaces as an ``InterpreterError``
whose cause was raised by ``triton.language``. Anything else at launch is a runtime error.
"""

from __future__ import annotations

import traceback


def is_compile_error(backend: str, exc: BaseException) -> bool:
    """True when ``exc`` means the config cannot be compiled (as opposed to a failure while running)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if backend == "triton":
        if "CompilationError" in names or "OutOfResources" in names:
            return True
        if "InterpreterError" in names:
            cause = exc.__cause__ or exc.__context__ or exc
            return _raised_in(cause, ("triton/language/", "triton/compiler/"))
        return False
    if backend == "tilelang":
        module = type(exc).__module__ or ""
        return module.startswith(("tvm", "tilelang")) or "TVMError" in names
    return False


def _raised_in(exc: BaseException, fragments: tuple[str, ...]) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return any(any(f in frame.filename.replace("\\", "/") for f in fragments) for frame in frames)
