"""One budget for the fleet: session, start and open-rate limits shared by processes.

:class:`FleetLimits` (``settings``) is the value a ``ClientConfig`` carries; a store
(``backend``: the interface; ``directory``, ``redis_store``, ``ray_store``: the
backends) keeps the shared state; ``worker`` is a process's side of it, one worker
thread per store; ``reporting`` reports each wait. See ``docs/fleet.md``.
"""

from envlink._fleet.settings import FleetLimits

__all__ = ["FleetLimits"]
