"""The API's routers, one module per resource; :mod:`api.main` mounts them under ``/v1``."""
