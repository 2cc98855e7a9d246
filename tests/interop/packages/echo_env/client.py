"""The echo environment's client: everything comes from OpenEnv's ``MCPToolClient``."""

from openenv.core.mcp_client import MCPToolClient


class EchoEnv(MCPToolClient):
    """Client of the echo environment: ``list_tools()``, ``call_tool(name, **kwargs)``,
    ``reset()``, ``step(CallToolAction(...))`` and ``state()``, all inherited."""
