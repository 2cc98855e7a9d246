"""Reaching a server before the session: where it is (a URL, a Space, a provider),
starting it, waiting until it is ready, and what it says of itself over plain HTTP."""

__all__: list[str] = []
