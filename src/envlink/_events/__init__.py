"""What the client and the pools tell their observers: hook bases and frozen records.

Below the client, the pools and the telemetry that observes them, so that the emitters
in ``_telemetry`` import the records they receive without importing what reports them.
"""

__all__: list[str] = []
