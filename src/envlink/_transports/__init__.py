"""The transport seam and its implementations (WebSocket, HTTP, mock)."""

__all__: list[str] = []
