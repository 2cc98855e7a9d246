"""``envlink replay PATH --url URL``: re-run recorded episodes against a server.

Each episode of the rollout files at ``PATH`` is run again on a session of its own:
the recorded reset kwargs, then the recorded actions in order. Every answer is
compared with the recorded one by the client's replay verifier (``--verify``), and
each episode is reported as reproduced, or by the first step that differs with
both answers side by side. Exit 0 when every episode reproduces, 1 when one
differs, 2 on a usage or connection error.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from envlink._client.client import GenericEnvClient
from envlink._config import positive_float, positive_int
from envlink._errors import ConnectError, EnvlinkError, HandshakeRejectedError
from envlink._recording.rollouts import answer_of, find_files, read_episodes, split_answer
from envlink._sansio.replay import same_answer

__all__ = ["DESCRIPTION", "add_arguments", "replay_from_args"]

DESCRIPTION = (
    "Re-run each recorded episode (its reset kwargs, then its actions) against a server "
    "and compare every answer with the recording. Exit 0: every episode reproduced; "
    "1: one differs; 2: usage or connection error.")

Verify = Callable[[dict[str, Any], dict[str, Any]], bool]


def _same_observation(recorded: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    return recorded.get("observation") == actual.get("observation")


#: ``--verify`` names; any other value is a ``module:function`` to import.
VERIFIERS: dict[str, Verify] = {"exact": same_answer, "observation": _same_observation}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``envlink replay``."""
    parser.add_argument("path", help="a rollout file, or a directory of *.jsonl files")
    parser.add_argument("--url", required=True, help="the server to replay against")
    parser.add_argument("--verify", default="exact",
                        help="how answers are compared: 'exact' (the whole answer, the "
                             "default), 'observation', or module:function taking "
                             "(recorded, replayed) answers")
    parser.add_argument("--json", action="store_true", help="machine output")
    parser.add_argument("-j", "--jobs", type=positive_int, default=4,
                        help="episodes replayed at once (default 4)")
    parser.add_argument("--timeout", type=positive_float, default=30.0,
                        help="deadline of each call in seconds (default 30)")


class _RawClient(GenericEnvClient):
    """A client whose reset and step return the answer's ``data`` as it came."""

    def _parse_result(self, payload: dict[str, Any]) -> Any:
        return payload


class _Unreachable(Exception):
    """The server could not be reached: a connection error, exit 2."""


def _verifier(name: str) -> Verify:
    if name in VERIFIERS:
        return VERIFIERS[name]
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ValueError(f"--verify must be one of {', '.join(VERIFIERS)} or "
                         f"module:function, got {name!r}")
    found = getattr(importlib.import_module(module), attr)
    if not callable(found):
        raise ValueError(f"--verify {name} is not callable")
    return found  # type: ignore[no-any-return]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix or "(answer)": value}


def side_by_side(recorded: Mapping[str, Any], replayed: Mapping[str, Any],
                 limit: int = 12) -> list[str]:
    """The fields that differ between two answers, one line each, in two columns."""
    left, right = _flatten(recorded), _flatten(replayed)
    keys = [k for k in dict.fromkeys([*left, *right]) if left.get(k, ...) != right.get(k, ...)]
    rows = [(f"{k}: {json.dumps(left[k]) if k in left else '(missing)'}",
             f"{k}: {json.dumps(right[k]) if k in right else '(missing)'}")
            for k in keys[:limit]]
    width = max([len("recorded"), *(len(a) for a, _ in rows)])
    lines = [f"    {'recorded'.ljust(width)} | replayed"]
    lines += [f"    {a.ljust(width)} | {b}" for a, b in rows]
    if len(keys) > limit:
        lines.append(f"    ... {len(keys) - limit} more fields differ")
    return lines


async def _replay_one(url: str, episode: dict[str, Any], verify: Verify,
                      timeout: float) -> dict[str, Any]:
    result: dict[str, Any] = {"episode_id": episode.get("episode_id"),
                              "steps": len(episode.get("steps") or ())}
    if episode.get("unknown_steps") or episode.get("truncated"):
        result["status"] = "skipped"
        result["reason"] = ("steps of unknown outcome" if episode.get("unknown_steps")
                            else "truncated")
        return result
    client = _RawClient(url, timeout=timeout)
    try:
        reset = episode["reset"]
        try:
            answer: Any = await client.reset(**reset.get("kwargs", {}))
        except (ConnectError, HandshakeRejectedError) as exc:
            raise _Unreachable(str(exc)) from exc
        first: tuple[str, dict[str, Any], dict[str, Any]] | None = None
        actual = answer_of(split_answer(answer))
        if not verify(answer_of(reset), actual):
            first = ("reset", answer_of(reset), actual)
        if first is None:
            for step in episode.get("steps") or ():
                answer = await client.step(step["action"])  # the data (_RawClient)
                actual = answer_of(split_answer(answer))
                if not verify(answer_of(step), actual):
                    first = (f"step {step.get('index')}", answer_of(step), actual)
                    break
        if first is None:
            result["status"] = "reproduced"
        else:
            result["status"] = "differs"
            result["at"], result["recorded"], result["replayed"] = first
    except _Unreachable:
        raise
    except EnvlinkError as exc:
        result["status"] = "differs"
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        await client.close()
    return result


async def _replay_all(url: str, episodes: list[tuple[str, dict[str, Any]]], verify: Verify,
                      jobs: int, timeout: float) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(jobs)

    async def one(where: str, episode: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            result = await _replay_one(url, episode, verify, timeout)
        result["where"] = where
        return result

    return list(await asyncio.gather(*(one(w, e) for w, e in episodes)))


def _episodes(path: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for file in find_files(path):
        for number, episode in enumerate(read_episodes(file), 1):
            out.append((f"{file.name}#{number}", episode))
    return out


def replay_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``envlink replay`` with parsed arguments; the exit status."""
    try:
        verify = _verifier(args.verify)
        episodes = _episodes(args.path)
    except (ValueError, ImportError, AttributeError, FileNotFoundError) as exc:
        sys.stderr.write(f"envlink replay: error: {exc}\n")
        return 2
    if not episodes:
        sys.stderr.write(f"envlink replay: error: no recorded episode in {args.path}\n")
        return 2
    try:
        results = asyncio.run(_replay_all(args.url, episodes, verify, args.jobs,
                                          args.timeout))
    except _Unreachable as exc:
        sys.stderr.write(f"envlink replay: cannot reach {args.url}: {exc}\n")
        return 2
    except (ValueError, EnvlinkError) as exc:  # a malformed URL, ...
        sys.stderr.write(f"envlink replay: error: {exc}\n")
        return 2
    differs = sum(r["status"] == "differs" for r in results)
    if args.json:
        sys.stdout.write(json.dumps({
            "episodes": len(results),
            "reproduced": sum(r["status"] == "reproduced" for r in results),
            "differs": differs,
            "skipped": sum(r["status"] == "skipped" for r in results),
            "results": results}) + "\n")
    else:
        for r in results:
            name = f"episode {r['episode_id']} ({r['where']})"
            if r["status"] == "reproduced":
                print(f"{name}: reproduced ({r['steps']} steps)")
            elif r["status"] == "skipped":
                print(f"{name}: skipped ({r['reason']})")
            elif "error" in r:
                print(f"{name}: differs: {r['error']}")
            else:
                print(f"{name}: differs at {r['at']}")
                for line in side_by_side(r["recorded"], r["replayed"]):
                    print(line)
        print(f"{len(results)} episodes: {len(results) - differs} reproduced or skipped, "
              f"{differs} differ")
    return 1 if differs else 0
