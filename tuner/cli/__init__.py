"""The ``tuner`` command line (Typer): ``tuner.cli.app:app`` is the console script; ``python -m tuner.cli``
runs the same app."""
