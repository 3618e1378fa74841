"""Helpers shared by the device backends: software versions, best-effort shell queries, argument checks."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
import subprocess
from collections.abc import Sequence

FLUSH_MIN_BYTES = 64 << 20  # smallest L2 flush buffer of the device backends

# Distribution names tried for each library (the first one installed wins): Triton also ships as
# ``pytorch-triton`` in PyTorch nightly wheels.
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
    "tilelang": ("tilelang",),
}


def package_version(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` found, without importing it; else None."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def library_versions(extra: Sequence[str] = ()) -> dict[str, str]:
    """Python and the versions of torch, triton, tilelang (and ``extra`` distributions) that are installed.

    Read from package metadata: tilelang is never imported just for its version.
    """
    versions = {"python": platform.python_version()}
    wanted = dict(_DISTRIBUTIONS)
    wanted.update({name: (name,) for name in extra})
    for name, dists in wanted.items():
        version = package_version(*dists)
        if version is not None:
            versions[name] = version
    return versions


# Libraries of comparators: recorded beside the fingerprint (reports print them), never part of the key.
COMPARATOR_LIBRARIES = ("mamba_ssm",)


def comparator_versions() -> dict[str, str]:
    """Versions of the comparator libraries found on the path, read from package metadata or else from the
    ``__version__`` line of the package's ``__init__.py`` (source copies without metadata): no import."""
    found: dict[str, str] = {}
    for name in COMPARATOR_LIBRARIES:
        version = package_version(name, name.replace("_", "-"))
        if version is None:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin:
                try:
                    text = open(spec.origin, encoding="utf-8").read()  # noqa: SIM115
                except OSError:
                    text = ""
                match = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", text)
                version = match.group(1) if match else "unknown"
        if version is not None:
            found[name] = version
    return found


def run_quiet(argv: Sequence[str], timeout_s: float = 10.0) -> str | None:
    """Stripped stdout of a command that succeeded, else None (missing tool, error, timeout)."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip()


def check_counts(n_fns: int, n_samples: int, warmup: int) -> None:
    """ValueError unless there is at least one callable, one sample and a non-negative warm-up count."""
    if n_fns < 1:
        raise ValueError("time() needs at least one callable")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
