"""EnvPool: batches of sessions over many endpoints, and the in-actor shard."""

__all__: list[str] = []
