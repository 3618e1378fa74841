"""The API's routers, one module per resource; :mod:`tuner.api.main` mounts them under ``/v1``."""
