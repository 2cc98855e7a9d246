"""The ``envlink`` command."""

__all__: list[str] = []
