"""``python -m tuner.cli``: the same command line as the ``tuner`` console script."""

from __future__ import annotations

from tuner.cli.app import app

app()
