"""What the reference server answers beside ``/ws`` frames: the upgrade, access, the
plain-HTTP routes and ``POST /mcp``."""

__all__: list[str] = []
