"""The environments the reference server serves."""

__all__: list[str] = []
