"""A stand-in for OpenEnv's client bases, and an environment package built on them.

Written into a temporary directory by the tests that need OpenEnv's class shapes
without OpenEnv itself (the interop suite runs the real one): ``openenv.core``
with ``EnvClient`` (abstract hooks, private I/O that must never run under
envlink), ``GenericEnvClient`` and the MCP clients with OpenEnv's MCP models, and
``openenv-tally_env``, a package whose typed client subclasses them the way
environment packages do.
"""

from __future__ import annotations

from pathlib import Path

STANDIN = {
    "openenv/__init__.py": "",
    "openenv/core/__init__.py": """
from .client_types import StepResult
from .env_client import EnvClient
from .generic_client import GenericEnvClient, GenericAction
""",
    "openenv/core/client_types.py": """
from dataclasses import dataclass
from typing import Any, Generic, Optional, TypeVar
ObsT = TypeVar("ObsT")

@dataclass
class StepResult(Generic[ObsT]):
    observation: ObsT
    reward: Optional[float] = None
    done: bool = False
    metadata: Any = None
""",
    "openenv/core/env_client.py": """
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar
ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")

class EnvClient(ABC, Generic[ActT, ObsT, StateT]):
    def __init__(self, base_url=None, connect_timeout_s=10.0, message_timeout_s=60.0,
                 provider=None, mode=None, headers=None):
        raise AssertionError("OpenEnv's own EnvClient.__init__ ran under envlink")

    async def _send_and_receive(self, message):
        raise AssertionError("OpenEnv's own I/O ran under envlink")

    async def _connect_async(self):
        raise AssertionError("OpenEnv's own I/O ran under envlink")

    def reset(self, **kwargs):
        raise AssertionError("OpenEnv's own reset ran under envlink")

    @abstractmethod
    def _step_payload(self, action): ...

    @abstractmethod
    def _parse_result(self, payload): ...

    @abstractmethod
    def _parse_state(self, payload): ...
""",
    "openenv/core/generic_client.py": """
from typing import Any, Dict
from .env_client import EnvClient

class GenericEnvClient(EnvClient[Dict[str, Any], Dict[str, Any], Dict[str, Any]]):
    def _step_payload(self, action):
        return action

    def _parse_result(self, payload):
        raise AssertionError("OpenEnv's GenericEnvClient hook ran under envlink")

    def _parse_state(self, payload):
        return payload

class GenericAction(Dict[str, Any]):
    def __init__(self, **kwargs):
        super().__init__(kwargs)
""",
    "openenv/core/mcp_client.py": """
from typing import Any, Dict, List, Optional
from pydantic import BaseModel, Field
from .client_types import StepResult
from .env_client import EnvClient

class Tool(BaseModel):
    name: str
    description: str = ""
    input_schema: Dict[str, Any] = Field(default_factory=dict)

class CallToolAction(BaseModel):
    type: str = "call_tool"
    tool_name: str
    arguments: Dict[str, Any] = Field(default_factory=dict)

class ListToolsAction(BaseModel):
    type: str = "list_tools"

class CallToolObservation(BaseModel):
    tool_name: str
    result: Any = None
    error: Any = None

class ListToolsObservation(BaseModel):
    tools: List[Tool]

class MCPClientBase(EnvClient[Any, Any, Any]):
    def __init__(self, base_url, mode=None):
        raise AssertionError("OpenEnv's MCPClientBase.__init__ ran under envlink")

    async def _production_mcp_request(self, method, params=None):
        raise AssertionError("OpenEnv's own I/O ran under envlink")

    async def list_tools(self, use_cache=True):
        raise AssertionError("OpenEnv's own list_tools ran under envlink")

    def _step_payload(self, action):
        return action.model_dump()

    def _parse_result(self, payload):
        obs = payload.get("observation", {})
        if "tools" in obs:
            observation = ListToolsObservation(tools=[
                Tool(name=t["name"], description=t.get("description", ""),
                     input_schema=t.get("input_schema", t.get("inputSchema", {})))
                for t in obs["tools"]])
        else:
            observation = CallToolObservation(tool_name=obs.get("tool_name", ""),
                                              result=obs.get("result"), error=obs.get("error"))
        return StepResult(observation=observation, reward=payload.get("reward"),
                          done=payload.get("done", False))

    def _parse_state(self, payload):
        return dict(payload)

class MCPToolClient(MCPClientBase):
    async def call_tool(self, name, **kwargs):
        raise AssertionError("OpenEnv's own call_tool ran under envlink")
""",
    # An environment package, as `openenv init` lays one out.
    "tally_env/__init__.py": """
from .client import TallyEnv
from .models import TallyAction, TallyObservation, TallyState
""",
    "tally_env/models.py": """
from pydantic import BaseModel

class TallyAction(BaseModel):
    message: str

class TallyObservation(BaseModel):
    echoed_message: str
    message_length: int = 0

class TallyState(BaseModel):
    episode_id: str = ""
    step_count: int = 0
""",
    "tally_env/client.py": """
from openenv.core import EnvClient, StepResult
from .models import TallyAction, TallyObservation, TallyState

class Labelled:
    '''A mixin of the package's own, kept as it is.'''
    label = "tally"

    def describe(self):
        return f"{self.label}:{type(self).__name__}"

class _TallyBase(EnvClient[TallyAction, TallyObservation, TallyState]):
    def _step_payload(self, action):
        return {"message": action.message}

    def _parse_result(self, payload):
        return StepResult(observation=TallyObservation(**payload["observation"]),
                          reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload):
        return TallyState(**payload)

class TallyEnv(Labelled, _TallyBase):
    def __init__(self, base_url=None, **kwargs):
        self.constructed_by_package = True
        super().__init__(base_url=base_url, **kwargs)

    def _step_payload(self, action):
        payload = super()._step_payload(action)
        payload["message"] = payload["message"].upper()
        return payload

    async def shout(self, message):
        '''A package method that steps (a coroutine, as OpenEnv's clients write them).'''
        result = await self.step(TallyAction(message=message))
        return result.observation.echoed_message

    @classmethod
    def default_action(cls):
        return TallyAction(message=cls.__name__)

    @property
    def kind(self):
        return super().describe()
""",
    "tally_env/openenv.yaml": "name: tally_env\ndescription: Tally environment\n",
    "echo_tools_env/__init__.py": "from .client import EchoToolsEnv\n",
    "echo_tools_env/client.py": """
from openenv.core.mcp_client import MCPToolClient

class EchoToolsEnv(MCPToolClient):
    '''An MCP environment's client: OpenEnv's echo client has this shape.'''
""",
}


#: The top-level packages the stand-in (and the tests' installed packages) provide.
STANDIN_PACKAGES = frozenset({"openenv", "tally_env", "echo_tools_env", "plain_env"})


def write_standin(root: Path) -> Path:
    """Write the stand-in OpenEnv and its packages under ``root``; return ``root``."""
    for relative, text in STANDIN.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"), encoding="utf-8")
    return root
