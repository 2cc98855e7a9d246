"""The async client: driver, connector, recovery, hooks."""

__all__: list[str] = []
