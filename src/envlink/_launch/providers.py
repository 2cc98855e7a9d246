"""``provider=``: servers the client starts itself, as OpenEnv 0.10's providers do.

A provider is duck-typed, so OpenEnv's own work unchanged:

- a *container* provider (``ContainerProvider``: ``start_container(...) -> base_url``,
  ``wait_for_ready(base_url, timeout_s)``, ``stop_container()``), or
- a *runtime* provider (``RuntimeProvider``: ``start(port, env_vars, **kw) -> base_url``,
  ``wait_for_ready(timeout_s)``, ``stop()``).

A :class:`ProviderLease` owns one provider's server for every client that uses it
(a client and its ``new_session()`` children): started by the first connect (in
a worker thread, since providers block), stopped when the last user releases it,
and stopped at once when starting or the readiness wait fails, so nothing is left
running. A start abandoned by a cancelled caller is stopped as soon as it ends.

As in OpenEnv 0.10, a stop is tried once per user call and the provider's own
exception is raised unchanged (the same object, envlink's context added as a note).
A failed stop stays *pending*: the next user call (``connect()``, ``new_session()``,
``reset()``, ``close()``...) tries it once more before anything else, and nothing
new starts on that provider until it succeeds. A stop that succeeded is not tried
again. A provider's start and readiness errors are raised unchanged too.

:class:`LocalServerProvider` is envlink's own runtime provider: a local server
command (``envlink serve``, or any OpenEnv app under uvicorn) on a free loopback
port, in its own process group, killed with its parent (``PR_SET_PDEATHSIG`` on
Linux), stopped with SIGTERM then SIGKILL. :class:`DockerProvider` runs an image
with ``docker run`` (the same command line as OpenEnv's ``LocalDockerProvider``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from envlink._errors import EnvlinkError, InvalidArgumentError, ProviderError
from envlink._launch.provider_errors import provider_error_class

if TYPE_CHECKING:
    from envlink._fleet.settings import FleetLimits

__all__ = ["DockerProvider", "LocalServerProvider", "ProviderLease", "add_note", "one_user_call",
           "bound_container", "docker_run_command", "lease_for",
           "required_start_parameters", "start_provider", "stop_once", "stop_provider"]

#: What envlink's own providers raise: also a RuntimeError, as OpenEnv's providers raise
#: when docker or the server command fails.
_RuntimeProviderError = provider_error_class(RuntimeError)

_LEASES: weakref.WeakKeyDictionary[Any, ProviderLease] = weakref.WeakKeyDictionary()
_LEASES_LOCK = threading.Lock()


def _kind(provider: object) -> str:
    if callable(getattr(provider, "start_container", None)):
        return "container"
    if callable(getattr(provider, "start", None)):
        return "runtime"
    # Also a TypeError, as OpenEnv raises for an object that is not a provider.
    raise provider_error_class(TypeError)(
        f"{type(provider).__name__} is not a provider: it needs start_container() "
        "(a container provider) or start() (a runtime provider)")


def required_start_parameters(func: Callable[..., Any]) -> list[str]:
    """The parameters ``func`` (a ``start_container``) cannot be called without.

    Keyword-only ones count, as in OpenEnv 0.10's check: a provider whose
    ``start_container(*, image)`` needs an image cannot start on its own either.
    """
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                           inspect.Parameter.POSITIONAL_OR_KEYWORD,
                           inspect.Parameter.KEYWORD_ONLY)]


def _wait_for_ready(wait: Callable[..., Any], timeout_s: float | None, *first: Any) -> None:
    if timeout_s is None:
        wait(*first)
        return
    try:
        params = inspect.signature(wait).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "timeout_s" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        wait(*first, timeout_s=timeout_s)
    else:
        wait(*first)


def start_provider(provider: object, ready_timeout: float | None,
                   lease: ProviderLease | None = None) -> str:
    """Start ``provider`` and wait for its server (blocking); return its base URL.

    ``wait_for_ready`` gets ``ready_timeout`` as ``timeout_s`` only when it is not
    ``None``: otherwise the provider's own default applies, as in OpenEnv.

    On any failure, whatever was started is stopped (one try) before the error is
    raised. If that stop fails too, the start's error is raised still, with the stop's
    failure noted on it, and ``lease`` (when given) records the stop as pending: the
    next user call tries it again before anything starts.

    Raises:
        InvalidArgumentError: a container provider that cannot start without arguments
            (a ``ValueError``, as OpenEnv raises).
        ProviderError: the provider is not one, or returned no URL.
        Exception: the provider's own start or readiness error, unchanged.
    """
    kind = _kind(provider)
    name = type(provider).__name__
    if kind == "container":
        required = required_start_parameters(provider.start_container)  # type: ignore[attr-defined]
        if required:
            # OpenEnv's ValueError (its wording first), for a provider it cannot start alone.
            raise InvalidArgumentError(
                f"{name} does not support provider-owned startup because start_container() "
                f"requires {', '.join(required)}. Start the provider manually and pass "
                "base_url, use from_docker_image(image, provider=...), or configure a "
                "provider with a constructor-owned image/source.")
    try:
        if kind == "container":
            url = provider.start_container()  # type: ignore[attr-defined]
            _wait_for_ready(provider.wait_for_ready, ready_timeout, url)  # type: ignore[attr-defined]
        else:
            url = provider.start()  # type: ignore[attr-defined]
            _wait_for_ready(provider.wait_for_ready, ready_timeout)  # type: ignore[attr-defined]
        if not isinstance(url, str) or not url:
            raise ProviderError(f"{name} returned {url!r} instead of a base URL")
    except BaseException as exc:
        try:
            if lease is not None:
                lease.stop_blocking()
            else:
                stop_once(provider)
        except Exception as stop_failure:
            # The start's error is the one to report; the stop's is noted on it.
            add_note(exc, f"envlink: stopping {name} after the failed start failed too "
                          f"({_describe(stop_failure)}): it may still be running; the next "
                          "call (connect, new_session, reset or close) tries the stop again "
                          "before anything starts")
        raise
    return url
def _describe(exc: BaseException) -> str:
    if isinstance(exc, EnvlinkError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` on Python 3.11+, once (an error raised again by a later
    call is the same object: its note is not repeated)."""
    add = getattr(exc, "add_note", None)  # Python 3.11+
    if add is not None and note not in (getattr(exc, "__notes__", None) or ()):
        add(note)


def stop_once(provider: object) -> None:
    """Stop ``provider``'s server (blocking): one ``stop_container()`` (a container
    provider) or ``stop()`` (a runtime provider). A provider with neither has nothing
    to stop.

    Raises:
        Exception: the provider's own failure, unchanged.
    """
    stop = getattr(provider, "stop_container", None)
    if not callable(stop):
        stop = getattr(provider, "stop", None)
    if callable(stop):
        stop()


def stop_provider(provider: object) -> BaseException | None:
    """Stop ``provider``'s server (blocking, one try); return the failure instead of
    raising it."""
    try:
        stop_once(provider)
    except Exception as exc:
        return exc
    return None


#: The leases whose stop the user call in progress has tried (``id()``s): a stop is
#: tried once per user call. ``None`` outside :func:`one_user_call`, where each client
#: call is a user call of its own. Set in the caller's context, so that the bridge's
#: copy of it, and the worker thread that stops, hold the same set.
_STOPS_TRIED: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar(
    "envlink_stops_tried", default=None)


@contextlib.contextmanager
def one_user_call() -> Iterator[None]:
    """Make the client calls run inside one user call: a ``with`` / ``async with`` block
    (its connect, then the close of its failed entry) or a bootstrap handle. A
    provider's stop is tried at most once in it; a stop already tried and failed is not
    tried again by the close that cleans up, and stays pending for the next user call.
    """
    token = _STOPS_TRIED.set(set())
    try:
        yield
    finally:
        _STOPS_TRIED.reset(token)


class ProviderLease:
    """One provider's server, shared by the clients that use it.

    A stop is tried once per call. One that fails leaves the stop *pending*: the
    server may still run, so nothing starts again on this provider until a stop
    succeeds (the next call tries it once, first, and raises the provider's error
    unchanged if it fails still). A stop that succeeded is not tried again.

    Args:
        provider: the provider.
        base_url: the URL of a server the provider already started (by
            ``from_docker_image``), or ``None`` to start it on first use.
    """

    def __init__(self, provider: object, base_url: str | None = None) -> None:
        _kind(provider)
        self.provider = provider
        self.base_url = base_url
        self.users = 0
        #: The fleet's shared limits its starts are paced and bounded by (``None``: none).
        self.fleet: FleetLimits | None = None
        #: The last stop's failure while it is pending (its server may still run).
        self.stop_failure: BaseException | None = None
        self._starting: asyncio.Future[str | _Raised] | None = None

    @property
    def stop_pending(self) -> bool:
        """Whether the last stop failed, so that the server may still be running."""
        return self.stop_failure is not None

    async def acquire(self, ready_timeout: float | None) -> str:
        """Count one more user; start the server if it is not running. Returns its URL.

        Raises:
            Exception: the provider's own error, unchanged: a pending stop failed again
                (nothing was started), or starting failed (what started was stopped).
        """
        self.users += 1
        try:
            return await self._url(ready_timeout)
        except BaseException:
            self.users -= 1
            raise

    async def _url(self, ready_timeout: float | None) -> str:
        if self.base_url is not None:
            return self.base_url
        if self._starting is None:
            loop = asyncio.get_running_loop()
            starting = loop.run_in_executor(None, contextvars.copy_context().run, _capture,
                                            self._start_blocking, ready_timeout)
            self._starting = starting
            starting.add_done_callback(self._started)
        outcome = await asyncio.shield(self._starting)
        if isinstance(outcome, _Raised):
            raise outcome.error
        return outcome

    def _start_blocking(self, ready_timeout: float | None) -> str:
        failure = self.stop_failure
        if failure is not None:
            # The previous server may still run: stop it first, or start nothing.
            if self._tried_in_this_call():
                raise failure  # tried already in this user call: once per call
            self.stop_blocking()
        if self.fleet is None:
            return start_provider(self.provider, ready_timeout, self)
        from envlink._fleet.worker import fleet_for  # its worker, only once a fleet is used
        expires = None if ready_timeout is None else time.monotonic() + ready_timeout
        with fleet_for(self.fleet).provider_start(expires):
            return start_provider(self.provider, ready_timeout, self)

    def _tried_in_this_call(self) -> bool:
        tried = _STOPS_TRIED.get()
        return tried is not None and id(self) in tried

    def stop_blocking(self) -> None:
        """Stop the server now (blocking, one try); record or clear a pending stop.

        Raises:
            Exception: the provider's own failure, unchanged (the same object), with a
                note saying that its server may still run; the stop is then pending.
        """
        tried = _STOPS_TRIED.get()
        if tried is not None:
            tried.add(id(self))
        try:
            stop_once(self.provider)
        except Exception as exc:
            self.stop_failure = exc
            add_note(exc, f"envlink: {type(self.provider).__name__} did not stop, so its "
                          "server may still be running; nothing new starts on this provider "
                          "until a stop succeeds (the next call, or close() again, tries it "
                          "once more)")
            raise
        self.stop_failure = None

    def _started(self, future: asyncio.Future[str | _Raised]) -> None:
        self._starting = None
        if future.cancelled() or future.exception() is not None:
            return
        outcome = future.result()
        if isinstance(outcome, _Raised):
            return
        self.base_url = outcome
        if self.users == 0:
            # Every caller gave up (cancelled) while it started: stop it now. A failure
            # is recorded as pending (no caller is left to raise it to).
            self.base_url = None
            stopping = asyncio.get_running_loop().run_in_executor(
                None, _capture, self.stop_blocking)
            stopping.add_done_callback(_consume_failure)

    async def release(self) -> None:
        """Count one user less; stop the server when none is left.

        Raises:
            Exception: the provider's stop failed (unchanged; pending: tried again by
                the next start, or by :meth:`retry_stop`).
        """
        self.users = max(0, self.users - 1)
        if self.users == 0 and self.base_url is not None:
            self.base_url = None
            await _in_thread(self.stop_blocking)

    async def retry_stop(self) -> None:
        """Try a pending stop once more (nothing to do if none is pending, the server is
        used, or this user call has tried it already: see :func:`one_user_call`).

        Raises:
            Exception: the provider's stop failed again (unchanged).
        """
        if self.retry_due():
            await _in_thread(self.stop_blocking)

    def retry_due(self) -> bool:
        """Whether :meth:`retry_stop` would try the stop now."""
        return (self.stop_failure is not None and self.users == 0 and self.base_url is None
                and not self._tried_in_this_call())

    def __repr__(self) -> str:
        return (f"ProviderLease({type(self.provider).__name__}, users={self.users}, "
                f"running={self.base_url is not None}, stop_pending={self.stop_pending})")


def _consume_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # recorded on the lease; retrieved, so asyncio does not log it


class _Raised:
    """What a provider call in a worker thread raised, carried as a value: an executor's
    future would replace a ``TimeoutError`` by a copy, and the provider's own exception
    must reach the caller as the same object."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _capture(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except BaseException as exc:
        return _Raised(exc)


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in the loop's executor; what it raises is raised unchanged."""
    outcome = await asyncio.get_running_loop().run_in_executor(
        None, contextvars.copy_context().run, _capture, fn, *args)
    if isinstance(outcome, _Raised):
        raise outcome.error
    return outcome


def lease_for(provider: object, base_url: str | None) -> ProviderLease:
    """The lease of ``provider``, shared by every client given the same provider object."""
    with _LEASES_LOCK:
        try:
            lease = _LEASES.get(provider)
        except TypeError:  # not weak-referenceable: a lease of its own
            return ProviderLease(provider, base_url)
        if lease is None:
            lease = ProviderLease(provider, base_url)
            _LEASES[provider] = lease
        elif base_url is not None and lease.base_url is None:
            lease.base_url = base_url
        return lease


class _BoundContainer:
    """A container provider with its ``start_container`` arguments bound."""

    def __init__(self, provider: object, image: str, kwargs: Mapping[str, Any]) -> None:
        self._provider = provider
        self._image = image
        self._kwargs = dict(kwargs)

    def start_container(self) -> str:
        return str(self._provider.start_container(self._image, **self._kwargs))  # type: ignore[attr-defined]

    def wait_for_ready(self, base_url: str, timeout_s: float | None = None) -> None:
        _wait_for_ready(self._provider.wait_for_ready, timeout_s, base_url)  # type: ignore[attr-defined]

    def stop_container(self) -> None:
        self._provider.stop_container()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self._provider).__name__}(image={self._image!r})"


def bound_container(provider: object, image: str, kwargs: Mapping[str, Any]) -> object:
    """``provider`` with ``start_container(image, **kwargs)`` bound (for ``from_docker_image``)."""
    if not callable(getattr(provider, "start_container", None)):
        raise ProviderError(f"{type(provider).__name__} is not a container provider "
                            "(no start_container())")
    return _BoundContainer(provider, image, kwargs)


# ----------------------------------------------------------------- local processes


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (another process may take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_spawn_pool: concurrent.futures.ThreadPoolExecutor | None = None
#: Server processes spawned by the pool's thread and not yet stopped.
_spawned = 0


def _spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **kwargs)`` from the one long-lived spawning thread.

    Linux sends the parent-death signal when the *thread* that forked exits, and a
    caller's thread (a worker of an executor, say) may end long before the process
    does; the spawning thread lives while a process it spawned runs, and ends with
    the last one's :func:`_forget_spawned`, so that no envlink thread is left.
    """
    global _spawn_pool, _spawned
    with _LEASES_LOCK:
        if _spawn_pool is None:
            _spawn_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="envlink-spawn")
        pool = _spawn_pool
        _spawned += 1
    try:
        process: subprocess.Popen[bytes] = pool.submit(
            lambda: subprocess.Popen(argv, **kwargs)).result()
        return process
    except BaseException:
        _forget_spawned()
        raise


def _forget_spawned() -> None:
    """A spawned process ended (or never started): the last one ends the spawning thread."""
    global _spawn_pool, _spawned
    with _LEASES_LOCK:
        _spawned -= 1
        if _spawned > 0 or _spawn_pool is None:
            return
        pool, _spawn_pool = _spawn_pool, None
    pool.shutdown(wait=True)


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die with this process (Linux only).

    libc is resolved here, in the parent: the child, forked from a process with
    threads, must only call async-signal-safe code before exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


class LocalServerProvider:
    """Runs a local server command on a free loopback port (an OpenEnv ``RuntimeProvider``).

    ``{host}`` and ``{port}`` in the command are replaced when it starts. By
    default it runs envlink's reference server (``python -m envlink serve``).
    The process has its own process group, which :meth:`stop` ends (SIGTERM, then
    SIGKILL after ``stop_timeout``); on Linux it is also killed if this process
    dies (``PR_SET_PDEATHSIG``), so an interrupted caller leaves no orphan.

    Args:
        command: the command line, e.g. ``["uvicorn", "app:app", "--host", "{host}",
            "--port", "{port}"]``; default: ``envlink serve --env {env}``.
        env: the reference server's environment (default command only).
        host: the loopback address to bind.
        cwd: the working directory.
        env_vars: environment variables added to this process's for the server.
        stop_timeout: seconds between SIGTERM and SIGKILL.
        stderr: where the server's output goes (default: discarded).

    Raises:
        ValueError: an empty command.
    """

    def __init__(self, command: Sequence[str] | None = None, *, env: str = "echo",
                 host: str = "127.0.0.1", cwd: str | os.PathLike[str] | None = None,
                 env_vars: Mapping[str, str] | None = None, stop_timeout: float = 5.0,
                 stderr: Any = subprocess.DEVNULL) -> None:
        self.command = list(command) if command is not None else [
            sys.executable, "-m", "envlink", "serve", "--host", "{host}", "--port", "{port}",
            "--env", env]
        if not self.command:
            raise ValueError("command must not be empty")
        self.host = host
        self.cwd = cwd
        self.env_vars = dict(env_vars or {})
        self.stop_timeout = stop_timeout
        self._stderr = stderr
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def uvicorn(cls, app: str, *, python: str | None = None, **kwargs: Any
                ) -> LocalServerProvider:
        """An OpenEnv app (``"server.app:app"``) under uvicorn, run by ``python``."""
        return cls([python or sys.executable, "-m", "uvicorn", app, "--host", "{host}",
                    "--port", "{port}"], **kwargs)

    @property
    def pid(self) -> int | None:
        """The server process id while it runs."""
        return self.process.pid if self.process is not None else None

    def start(self, port: int | None = None, env_vars: Mapping[str, str] | None = None,
              **kwargs: Any) -> str:
        """Start the server; return its base URL (``http://127.0.0.1:PORT``).

        Raises:
            ProviderError: it is already running, or the command cannot be run.
        """
        with self._lock:
            if self.process is not None and self.process.poll() is None:
                raise _RuntimeProviderError("the server is already running; stop() it first")
            chosen = port if port is not None else free_port(self.host)
            argv = [part.replace("{host}", self.host).replace("{port}", str(chosen))
                    for part in self.command]
            environment = {**os.environ, **self.env_vars, **dict(env_vars or {})}
            try:
                self.process = _spawn(
                    argv, cwd=self.cwd, env=environment,
                    stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr,
                    start_new_session=True, preexec_fn=_parent_death_signal())
            except OSError as exc:
                raise _RuntimeProviderError(f"cannot run {argv[0]!r}: {exc}") from exc
            self.base_url = f"http://{self.host}:{chosen}"
            return self.base_url

    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until the server answers ``/health`` (or exits, or the time is up).

        Raises:
            ProviderError: the server exited, or never started.
            NotReadyError: not ready within ``timeout_s``.
        """
        process, url = self.process, self.base_url
        if process is None or url is None:
            raise _RuntimeProviderError("the server was not started")
        _run_async(lambda: _ready_or_exited(process, url, timeout_s))

    def stop(self) -> None:
        """Stop the server and its process group (SIGTERM, then SIGKILL). Idempotent."""
        with self._lock:
            process, self.process, self.base_url = self.process, None, None
        if process is None:
            return
        try:
            _kill_group(process, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)
                process.wait()
            else:
                _kill_group(process, signal.SIGKILL)  # whatever else is left in its group
        finally:
            _forget_spawned()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.process is not None else "stopped"
        return f"LocalServerProvider({self.command[0]!r}..., {state})"


def _kill_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _run_async(factory: Callable[[], Any]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    # Called from a thread that runs a loop: wait on a thread of its own.
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="envlink-provider-ready", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0] if result else None


async def _ready_or_exited(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    from envlink._config import ConnectionOptions
    from envlink._launch.discovery import wait_until_ready
    from envlink._sansio.policies import ReconnectPolicy
    from envlink._transports.base import parse_endpoint

    ready = asyncio.ensure_future(wait_until_ready(
        parse_endpoint(url), ConnectionOptions(proxy=None),
        ReconnectPolicy(initial_delay=0.05, max_delay=0.5), timeout_s, attempt_timeout=2.0))
    exited = _exit_of(process)
    try:
        waiting: set[asyncio.Future[Any]] = {ready, exited}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if ready in done:
            ready.result()
            return
        raise _RuntimeProviderError(
            f"the server command exited with code {exited.result()} before it was ready "
            f"on {url}")
    finally:
        ready.cancel()
        with contextlib.suppress(BaseException):
            await ready
        exited.cancel()


def _exit_of(process: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """A future of the process's exit code, set from a daemon thread (not the loop's
    executor, whose shutdown would otherwise wait for a server that keeps running)."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()

    def settle(code: int) -> None:
        if not exited.done():
            exited.set_result(code)

    def watch() -> None:
        code = process.wait()
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, code)

    threading.Thread(target=watch, name="envlink-provider-watch", daemon=True).start()
    return exited


# ---------------------------------------------------------------------- docker


def docker_run_command(image: str, *, name: str, port: int,
                       env_vars: Mapping[str, str] | None = None,
                       container_port: int = 8000) -> list[str]:
    """The ``docker run`` command line that :class:`DockerProvider` runs (as OpenEnv's)."""
    command = ["docker", "run", "-d", "--name", name, "-p",
               f"127.0.0.1:{port}:{container_port}"]
    for key, value in (env_vars or {}).items():
        command += ["-e", f"{key}={value}"]
    command.append(image)
    return command


class DockerProvider:
    """Runs an image with the local ``docker`` (an OpenEnv ``ContainerProvider``).

    The port is published on 127.0.0.1 only; :meth:`stop_container` stops and
    removes the container.

    Args:
        docker: the docker executable (name or path).
    """

    def __init__(self, docker: str = "docker") -> None:
        self.docker = docker
        self.container_id: str | None = None
        self.base_url: str | None = None

    def _executable(self) -> str:
        found = shutil.which(self.docker)
        if found is None:
            raise _RuntimeProviderError(
                f"docker is not available ({self.docker!r} is not on PATH): install Docker, "
                "or pass provider=LocalServerProvider(...) to run the server locally")
        return found

    def start_container(self, image: str, port: int | None = None,
                        env_vars: Mapping[str, str] | None = None, **kwargs: Any) -> str:
        """``docker run -d`` the image; return ``http://127.0.0.1:PORT``.

        Raises:
            ProviderError: docker is missing, or ``docker run`` failed.
        """
        docker = self._executable()
        chosen = port if port is not None else free_port()
        name = f"envlink-{image.rsplit('/', 1)[-1].split(':')[0]}-{int(time.time() * 1000)}"
        command = docker_run_command(image, name=name, port=chosen, env_vars=env_vars)
        command[0] = docker
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise _RuntimeProviderError(f"docker run {image} failed: {exc}") from exc
        if done.returncode != 0:
            # Values of -e may be secrets: the error names the image, not the command.
            raise _RuntimeProviderError(
                f"docker run {image} failed with exit code {done.returncode}: "
                f"{done.stderr.strip()[-500:]}")
        self.container_id = done.stdout.strip()
        self.base_url = f"http://127.0.0.1:{chosen}"
        return self.base_url

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Wait until the container answers ``/health``.

        Raises:
            NotReadyError: not ready within ``timeout_s``.
        """
        from envlink._config import ConnectionOptions
        from envlink._launch.discovery import wait_until_ready
        from envlink._sansio.policies import ReconnectPolicy
        from envlink._transports.base import parse_endpoint

        _run_async(lambda: wait_until_ready(
            parse_endpoint(base_url), ConnectionOptions(proxy=None),
            ReconnectPolicy(initial_delay=0.1, max_delay=1.0), timeout_s, attempt_timeout=2.0))

    def stop_container(self) -> None:
        """Stop and remove the container. Idempotent; a failure can be retried.

        Raises:
            ProviderError: ``docker rm -f`` failed (the container is kept, to retry).
        """
        container = self.container_id
        if container is None:
            return
        docker = self._executable()
        # A graceful stop first; the removal below also kills whatever it left running.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([docker, "stop", container], capture_output=True, timeout=30,
                           check=False)
        try:
            done = subprocess.run([docker, "rm", "-f", container], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise _RuntimeProviderError(f"docker rm -f {container} failed: {exc}") from exc
        if done.returncode != 0 and "no such container" not in done.stderr.lower():
            raise _RuntimeProviderError(f"docker rm -f {container} failed with exit code "
                                        f"{done.returncode}: {done.stderr.strip()[-500:]}")
        self.container_id = self.base_url = None
