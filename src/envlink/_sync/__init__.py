"""Blocking use of the async client and pool: the sync facade and the calls without ``await``.

Below the client: it knows the client's classes for type checking only (the facade's Task
API wraps whatever ``client.tasks`` gives). Which module owns which rule is in
``docs/architecture.md`` ("Blocking use").
"""

__all__: list[str] = []
