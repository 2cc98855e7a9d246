"""The async client: driver, connector, recovery, hooks, sync facade."""

__all__: list[str] = []
