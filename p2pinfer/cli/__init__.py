"""The ``p2pinfer`` command line (typer + rich)."""
