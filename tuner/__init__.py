"""tuner: kernel autotuning and performance exploration.

The engine lives here (template contract, search spaces, measurement, study driver, worker, client, CLI);
kernel templates live in ``kernels/``, the SQL store in ``db/`` and the HTTP API in ``api/``.
"""

from __future__ import annotations

__version__ = "0.1.0"
