"""The one rule for the types envlink mirrors from OpenEnv: with ``openenv`` importable,
what an MCP client returns is an instance of OpenEnv's classes too and a tool error's
kind is OpenEnv's enum member; without it, envlink's classes stand alone.

OpenEnv here is a small stand-in of its two model modules (the interop suite runs the
real one), in a fresh interpreter, as a user with both packages installed has them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envlink import CallToolObservation, EchoEnv, ToolErrorType

pytestmark = pytest.mark.timeout(60)

SRC = Path(os.environ.get("ENVLINK_SRC", Path(__file__).resolve().parents[2] / "src"))

OPENENV = {
    "openenv/__init__.py": "",
    "openenv/core/__init__.py": "",
    "openenv/core/env_server/__init__.py": "",
    "openenv/core/env_server/types.py": """
from typing import Optional
from pydantic import BaseModel

class State(BaseModel):
    episode_id: Optional[str] = None
    step_count: int = 0
""",
    "openenv/core/env_server/mcp_types.py": """
from enum import Enum
from typing import Any, Dict, List, Optional
from pydantic import BaseModel, ConfigDict

class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str
    input_schema: Dict[str, Any]

class ToolErrorType(str, Enum):
    EXECUTION_ERROR = "execution_error"
    INVALID_ARGS = "invalid_args"
    TRANSPORT_ERROR = "transport_error"
    TOOL_NOT_FOUND = "tool_not_found"
    TIMEOUT = "timeout"

class ToolError(BaseModel):
    error_type: ToolErrorType
    message: str

class ListToolsObservation(BaseModel):
    tools: List[Tool]

class CallToolObservation(BaseModel):
    tool_name: str
    result: Any = None
    error: Optional[ToolError] = None
""",
}

SCRIPT = """
import json
import pickle
from openenv.core.env_server.mcp_types import (
    CallToolObservation, ListToolsObservation, Tool, ToolError, ToolErrorType)
from openenv.core.env_server.types import State
from envlink import EchoEnv, MCPToolClient
import envlink

env = EchoEnv("http://127.0.0.1:9")
failed = env._parse_result({"observation": {"tool_name": "nope", "result": None,
    "error": {"error_type": "tool_not_found", "message": "no tool nope"}}}).observation
listed = MCPToolClient("http://127.0.0.1:9")._parse_result({"observation": {"tools": [
    {"name": "t", "description": "d", "inputSchema": {"type": "object"}}]}}).observation
odd = envlink.ToolError(error_type="rate_limited", message="slow down")
print(json.dumps({
    "call": isinstance(failed, CallToolObservation),
    "call_is_list": isinstance(failed, ListToolsObservation),
    "list": isinstance(listed, ListToolsObservation),
    "tool": isinstance(listed.tools[0], Tool),
    "error": isinstance(failed.error, ToolError),
    "kind_is_member": failed.error.error_type is ToolErrorType.TOOL_NOT_FOUND,
    "kind_equals_envlinks": failed.error.error_type == envlink.ToolErrorType.TOOL_NOT_FOUND,
    "state": isinstance(env._parse_state({"episode_id": "e", "step_count": 2}), State),
    "still_envlinks": isinstance(failed, envlink.CallToolObservation) and failed["tool_name"],
    "pickles": type(pickle.loads(pickle.dumps(failed))) is type(failed),
    "odd_kind": [odd.error_type.value, odd.model_dump(mode="json")["error_type"]],
}))
"""


def test_with_openenv_importable_returned_types_are_openenvs(tmp_path: Path) -> None:
    """Code that swapped only the client import: isinstance against OpenEnv's
    CallToolObservation, ListToolsObservation, Tool, ToolError and State holds, and
    `error.error_type is ToolErrorType.TOOL_NOT_FOUND` (OpenEnv's enum) is True; the
    objects are still envlink's (readable by key), and a kind OpenEnv does not list
    is kept."""
    for name, text in OPENENV.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=50, check=False, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "call": True, "call_is_list": False, "list": True, "tool": True, "error": True,
        "kind_is_member": True, "kind_equals_envlinks": True, "state": True,
        "still_envlinks": "nope", "pickles": True, "odd_kind": ["rate_limited", "rate_limited"]}


def test_without_openenv_envlinks_classes_stand_alone() -> None:
    """No openenv here: a tool error's kind is envlink's own member."""
    observation = EchoEnv("http://127.0.0.1:9")._parse_result({"observation": {
        "tool_name": "nope", "error": {"error_type": "tool_not_found", "message": "x"}}})
    error = observation.observation.error
    assert isinstance(observation.observation, CallToolObservation)
    assert error is not None and error.error_type is ToolErrorType.TOOL_NOT_FOUND
