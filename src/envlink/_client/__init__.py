"""The asyncio client over the sans-I/O core: the one client every surface builds on.

OpenEnv's client surface (MCP tool clients, ``adopt()``, ``AutoEnv``, the harness client)
sits above it in ``_openenv``; which module owns which rule is in ``docs/architecture.md``.
"""

__all__: list[str] = []
