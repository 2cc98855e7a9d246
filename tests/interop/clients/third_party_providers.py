"""The third-party providers on PyPI (openenv-sprites, openenv-openshell) through OpenEnv's
client or envlink's: only the client's import differs.

``python third_party_providers.py openenv|envlink CASE SERVER_URL`` runs one case and
prints one JSON line: how each call ended (``ok`` or the exception's class name) and
what the faked cloud saw. OpenEnv's client runs under the openenv virtualenv's
interpreter; envlink's under envlink's, with that virtualenv's site-packages appended
to the path (``OPENENV_SITE``: a user's environment holds both the client and the
provider packages).

The providers are the real classes, unmodified; only their cloud calls are faked, at
their SDK boundary: the Sprites SDK's ``SpritesClient`` (and the ``Sprite`` objects it
makes), and OpenShell's sandbox adapter (``openenv_openshell.provider.connect``, the
one place its gRPC SDK is reached). The faked cloud "runs" the environment at
SERVER_URL, a real OpenEnv counter server: the readiness checks poll its ``/health``
and the client's WebSocket reaches it (through the Sprites provider's own local proxy).

Cases:

- ``sprites_owned``: ``GenericEnvClient(provider=SpritesProvider(source=...))``, the
  provider started by the client; an episode; ``close()`` deletes the Sprite.
- ``sprites_from_docker_image``: ``from_docker_image("hf://...", provider=...)``.
- ``sprites_failed_delete``: the Sprite's delete fails at ``close()``. The provider
  clears its handles before deleting, so the error must reach the caller; a second
  ``close()`` then finds nothing to delete.
- ``openshell_missing_image``: ``GenericEnvClient(provider=OpenShellProvider())``: its
  ``start_container()`` needs an image, refused before any cloud call.
- ``openshell_from_docker_image``: ``from_docker_image(IMAGE, provider=...)``; an
  episode; ``close()`` deletes the sandbox.
- ``openshell_failed_delete``: the sandbox's delete fails at ``close()``, and again at
  the second ``close()``.
- ``openshell_delete_retried``: the delete fails at ``close()``; the second ``close()``
  tries the pending stop again, which now confirms the deletion.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from types import SimpleNamespace
from typing import Any

WHICH, CASE, SERVER_URL = sys.argv[1:4]

if WHICH == "openenv":
    from openenv.core import GenericEnvClient
else:
    sys.path.append(os.environ["OPENENV_SITE"])
    from envlink import GenericEnvClient  # the one line a user changes

import httpx  # noqa: E402
import openenv_openshell.provider as openshell_provider  # noqa: E402
import sprites  # noqa: E402
from openenv_openshell import OpenShellProvider  # noqa: E402
from openenv_openshell._adapter import Deletion, Sandbox  # noqa: E402
from openenv_sprites import SpritesProvider  # noqa: E402

TOKEN = "sprites-test-token-0123456789"
SOURCE = "hf://openenv/counter_env"
IMAGE = "ghcr.io/example/counter-env:latest"
#: OpenShell 0.1.2 runs a sandbox only with an explicit command.
COMMAND = ("uvicorn", "server.app:app", "--host", "0.0.0.0", "--port", "8000")

#: What the faked cloud saw.
cloud: dict[str, Any] = {"created": 0, "delete_calls": 0, "deleted": 0, "sdk_clients": 0,
                         "sdk_clients_closed": 0, "connects": 0}
#: Each failed call's exception, for the test's failure message (not compared).
errors: list[str] = []
#: Set to make the cloud's deletes fail.
failing = {"delete": False}


# ------------------------------------------------------------------- the Sprites SDK


class FakeSprite:
    """A Sprite as the SDK returns it: commands succeed, the service "runs" SERVER_URL."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.url: str | None = None

    def run(self, *args: str, **kwargs: Any) -> Any:
        return SimpleNamespace(returncode=0, stdout=b"", stderr=b"")

    def create_service(self, **kwargs: Any) -> Any:
        self.url = SERVER_URL
        return iter(())

    def get_service(self, name: str) -> Any:
        return SimpleNamespace(state=SimpleNamespace(status="running", error=None,
                                                     restart_count=0))

    def destroy(self) -> None:
        cloud["delete_calls"] += 1
        if failing["delete"]:
            raise sprites.exceptions.SpriteError("delete refused: status 403")
        cloud["deleted"] += 1


class FakeSpritesClient:
    """``sprites.SpritesClient``: makes FakeSprites; its HTTP client is a real one."""

    def __init__(self, token: str, base_url: str = "") -> None:
        self.token = token
        self.http_client = httpx.Client()
        cloud["sdk_clients"] += 1

    def create_sprite(self, name: str, **options: Any) -> FakeSprite:
        cloud["created"] += 1
        return FakeSprite(name)

    def close(self) -> None:
        self.http_client.close()
        cloud["sdk_clients_closed"] += 1


sprites.SpritesClient = FakeSpritesClient  # type: ignore[misc,assignment]


# ------------------------------------------------------------- OpenShell's SDK adapter


class FakeAdapter:
    """OpenShell's ``SandboxAdapter``: the sandbox's service is SERVER_URL."""

    def create(self, request: Any) -> Sandbox:
        cloud["created"] += 1
        return Sandbox(name=request.name, sandbox_id="sandbox-1",
                       service_urls={request.service_name: SERVER_URL})

    def wait_ready(self, sandbox_name: str, *, workspace: str, timeout_s: float) -> Sandbox:
        return Sandbox(name=sandbox_name, sandbox_id="sandbox-1")

    def service_url(self, sandbox: Sandbox, service_name: str) -> str | None:
        return sandbox.service_urls.get(service_name)

    def delete(self, sandbox_name: str, *, workspace: str,
               expected_sandbox_id: str) -> Deletion:
        cloud["delete_calls"] += 1
        if failing["delete"]:
            raise RuntimeError("gateway unavailable")
        return Deletion(sandbox_id=expected_sandbox_id, outcome="accepted")

    def wait_deleted(self, sandbox_name: str, *, workspace: str, expected_sandbox_id: str,
                     timeout_s: float) -> None:
        if failing["delete"]:
            raise RuntimeError("sandbox still present")
        cloud["deleted"] += 1

    def close(self) -> None:
        cloud["sdk_clients_closed"] += 1


def fake_connect(*, gateway: str | None = None) -> FakeAdapter:
    cloud["connects"] += 1
    return FakeAdapter()


openshell_provider.connect = fake_connect  # type: ignore[assignment]


# ------------------------------------------------------------------------------ cases


def outcome(exc: BaseException) -> str:
    """The exception's class as OpenEnv code catches it: the first class of its MRO that
    is not envlink's own (envlink's ``InvalidArgumentError`` is a ``ValueError``)."""
    for cls in type(exc).__mro__:
        if not cls.__module__.startswith("envlink"):
            return cls.__name__
    return type(exc).__name__


async def attempt(calls: list[Any], name: str, call: Any) -> Any:
    """Run ``call()`` (awaited), noting ``[name, "ok" or the exception's class]``."""
    try:
        value = await call()
    except Exception as exc:  # the outcome is the report
        calls.append([name, outcome(exc)])
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
        return None
    calls.append([name, "ok"])
    return value


async def episode(calls: list[Any], client: Any) -> None:
    reset = await attempt(calls, "reset", client.reset)
    step = await attempt(calls, "step", lambda: client.step({"delta": 3}))
    calls.append(["observations", reset and reset.observation, step and step.observation])


async def main() -> dict[str, Any]:
    calls: list[Any] = []
    report: dict[str, Any] = {"calls": calls, "cloud": cloud, "errors": errors}
    if CASE in ("sprites_owned", "sprites_failed_delete"):
        provider = SpritesProvider(source=SOURCE, token=TOKEN, readiness_poll_interval_s=0.1)
        client = GenericEnvClient(provider=provider)
        await episode(calls, client)
        failing["delete"] = CASE == "sprites_failed_delete"
        await attempt(calls, "close", client.close)
        await attempt(calls, "close again", client.close)
        report["sprite_handle"] = provider.sprite is not None
        report["diagnostics"] = {key: provider.diagnostics.get(key) for key in
                                 ("sprite_delete_attempted", "sprite_deleted")}
    elif CASE == "sprites_from_docker_image":
        provider = SpritesProvider(token=TOKEN, readiness_poll_interval_s=0.1)
        client = await attempt(calls, "from_docker_image", lambda: GenericEnvClient
                               .from_docker_image(SOURCE, provider=provider))
        if client is not None:
            await episode(calls, client)
            await attempt(calls, "close", client.close)
        report["diagnostics"] = {key: provider.diagnostics.get(key) for key in
                                 ("sprite_delete_attempted", "sprite_deleted")}
    elif CASE == "openshell_missing_image":
        provider = OpenShellProvider(restricted_alpha_cleanup_acknowledged=True,
                                     command=COMMAND)
        client = GenericEnvClient(provider=provider)
        await attempt(calls, "connect", client.connect)
        await attempt(calls, "reset", client.reset)
        await attempt(calls, "close", client.close)
    elif CASE in ("openshell_from_docker_image", "openshell_failed_delete",
                  "openshell_delete_retried"):
        provider = OpenShellProvider(restricted_alpha_cleanup_acknowledged=True,
                                     command=COMMAND, health_poll_interval_s=0.1)
        client = await attempt(calls, "from_docker_image", lambda: GenericEnvClient
                               .from_docker_image(IMAGE, provider=provider))
        if client is not None:
            await episode(calls, client)
            failing["delete"] = CASE != "openshell_from_docker_image"
            await attempt(calls, "close", client.close)
            failing["delete"] = CASE == "openshell_failed_delete"
            await attempt(calls, "close again", client.close)
        report["state"] = {"created": provider.state.created, "deleted": provider.state.deleted}
    else:
        raise SystemExit(f"unknown case {CASE!r}")
    return report


print(json.dumps(asyncio.run(main()), default=repr))
