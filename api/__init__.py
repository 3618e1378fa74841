"""The HTTP API of tuner (FastAPI): jobs, best configs, templates, history, workers under ``/v1``.

``tuner.api.main.create_app(settings, store=None)`` builds the application; ``tuner serve`` runs it with uvicorn.
The API validates input against the registry and the search spaces, writes jobs to the store's queue and
reads what workers publish; it never runs kernels (workers talk to the database directly).
"""
