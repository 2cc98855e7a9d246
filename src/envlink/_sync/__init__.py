"""Blocking use of the async client and pool: the sync facade and the calls without ``await``.

* ``facade``: :class:`BlockingFacade`, what ``client.sync()`` and ``pool.sync()`` share:
  the bridge, the one way into a blocking call (``blocking_call``), ``close()``;
* ``sync_client``: :class:`SyncEnvClient`, the client's facade;
* ``dispatch``: the client's methods dispatched as OpenEnv 0.10 dispatches them
  (blocking in plain code, a coroutine when awaited, :class:`AutoResult` in between);
* ``default_bridge``: the process-wide bridge that facades not given one share.

Below the client: it knows the client's classes for type checking only (the facade's Task
API wraps whatever ``client.tasks`` gives).
"""

__all__: list[str] = []
