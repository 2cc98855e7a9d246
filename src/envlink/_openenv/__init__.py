"""OpenEnv 0.10's client surface on envlink's client: what OpenEnv code imports by name.

The MCP tool client, ``adopt()`` of an OpenEnv client class, ``AutoEnv`` /
``AutoAction`` / ``GenericAction``, and the ``/harness`` client with its blocking
facade. Above the async client (``_client``), which knows none of them; which module
owns which rule is in ``docs/architecture.md``.
"""

__all__: list[str] = []
