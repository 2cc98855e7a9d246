"""The sans-I/O core: protocol, session state, journal, policies, retry. No I/O."""

__all__: list[str] = []
