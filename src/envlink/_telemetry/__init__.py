"""OpenTelemetry and structlog emitters, behind the client's and bridge's hooks."""

__all__: list[str] = []
