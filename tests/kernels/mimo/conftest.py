"""Mamba3 MIMO kernel tests: Triton runs under its interpreter unless a CUDA device is present
(tests/conftest.py sets TRITON_INTERPRET before anything imports Triton)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def device() -> str:
    """Where Triton kernels run: the CPU under the interpreter, else the GPU."""
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
