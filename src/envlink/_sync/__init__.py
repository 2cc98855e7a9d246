"""Blocking use of the async client and pool: the sync facades and the default bridge.

Beside the client: neither imports the other. The client's facade runs any object of the
``AsyncEnv`` protocol it declares (its Task API wraps whatever ``client.tasks`` gives);
``envlink`` installs it as what ``client.sync()`` makes. Which module owns which rule is
in ``docs/architecture.md`` ("Blocking use").
"""

__all__: list[str] = []
