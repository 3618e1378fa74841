"""Serving tuned configs: the queue worker, the API server process, remote calls, the runtime client.

``worker`` (claims jobs from the store queue and runs their trials), ``serve`` (``tuner serve``: API + local
worker), ``remote`` (HTTP calls of the CLI), ``client`` (the runtime client with its cache and export
file), ``export`` (the offline export file). The lookup rule they share (exact → nearest → default) is
:mod:`tuner.lookup`, in the core, because the driver's warm starts use its shape distance too.
"""
