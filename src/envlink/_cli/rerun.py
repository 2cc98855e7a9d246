"""``envlink replay PATH --url URL``: re-run recorded episodes against a server.

Each episode of the rollout files at ``PATH`` (its parts joined) is run again on a
session of its own: the recorded reset kwargs, then the recorded actions in order.
Every answer is compared with the recorded one by the replay verifier (``--verify``),
leaving out the ``--ignore`` fields, and each episode is reported as reproduced, or
by the first step that differs with both answers side by side. Exit 0 when every
episode reproduces (or cannot be judged: skipped, redacted, incomplete), 1 when an
answer differs, 2 on a usage error, a connection error, a server that fails
mid-episode or a verifier that raises.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envlink._cli.rollout_summary import plural, report_bad_lines
from envlink._client.client import GenericEnvClient
from envlink._config import positive_float, positive_int
from envlink._errors import ConnectError, EnvlinkError, HandshakeRejectedError
from envlink._recording.rollouts import RolloutFiles, answer_of, read_episodes, split_answer

__all__ = ["DESCRIPTION", "VERIFIERS", "add_arguments", "replay_from_args", "same_value",
           "without_fields"]

DESCRIPTION = (
    "Re-run each recorded episode (its reset kwargs, then its actions) against a server "
    "and compare every answer with the recording. Exit 0: every episode reproduced (or "
    "could not be judged: skipped, redacted, incomplete); 1: an answer differs; 2: a "
    "usage or connection error, a server that failed mid-episode, or a verifier that "
    "raised.")

Verify = Callable[[dict[str, Any], dict[str, Any]], bool]


def same_value(recorded: Any, actual: Any) -> bool:
    """Equal as JSON values are, except that NaN equals NaN (at any depth)."""
    if isinstance(recorded, float) and isinstance(actual, float):
        return recorded == actual or (math.isnan(recorded) and math.isnan(actual))
    if isinstance(recorded, Mapping) and isinstance(actual, Mapping):
        return (recorded.keys() == actual.keys()
                and all(same_value(recorded[k], actual[k]) for k in recorded))
    if isinstance(recorded, list) and isinstance(actual, list):
        return (len(recorded) == len(actual)
                and all(same_value(a, b) for a, b in zip(recorded, actual, strict=True)))
    return bool(recorded == actual)


def _same_observation(recorded: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    return same_value(recorded.get("observation"), actual.get("observation"))


#: ``--verify`` names; any other value is a ``module:function`` to import.
VERIFIERS: dict[str, Verify] = {"exact": same_value, "observation": _same_observation}


def without_fields(answer: Mapping[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """A copy of ``answer`` without the dotted ``fields`` (``metadata.timestamp``: the
    ``timestamp`` key of the ``metadata`` object); a field not there is ignored."""
    out = copy.deepcopy(dict(answer))
    for name in fields:
        *path, last = name.split(".")
        node: Any = out
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``envlink replay``."""
    parser.add_argument("path", help="a rollout file, or a directory of *.jsonl files")
    parser.add_argument("--url", required=True, help="the server to replay against")
    parser.add_argument("--verify", default="exact",
                        help="how answers are compared: 'exact' (the whole answer, the "
                             "default; NaN equals NaN), 'observation', or module:function "
                             "taking (recorded, replayed) answers")
    parser.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                        help="leave FIELD out of the comparison (repeatable); a dotted "
                             "path into the answer, such as metadata.timestamp or "
                             "observation.clock")
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
    """The verifier ``--verify`` names; checked before anything connects.

    Raises:
        ValueError: not a verifier's name nor ``module:function``, or not callable.
        ImportError, AttributeError: the module or function is not there.
    """
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
    keys = [k for k in dict.fromkeys([*left, *right])
            if k not in left or k not in right or not same_value(left[k], right[k])]
    rows = [(f"{k}: {json.dumps(left[k]) if k in left else '(missing)'}",
             f"{k}: {json.dumps(right[k]) if k in right else '(missing)'}")
            for k in keys[:limit]]
    width = max([len("recorded"), *(len(a) for a, _ in rows)])
    lines = [f"    {'recorded'.ljust(width)} | replayed"]
    lines += [f"    {a.ljust(width)} | {b}" for a, b in rows]
    if len(keys) > limit:
        lines.append(f"    ... {len(keys) - limit} more fields differ")
    return lines


class _Judge:
    """Compares a recorded and a replayed answer: ``--ignore`` fields left out, then
    the verifier; a verifier that raises is reported as that."""

    def __init__(self, name: str, verify: Verify, ignore: Sequence[str]) -> None:
        self.name, self.verify, self.ignore = name, verify, list(ignore)

    def __call__(self, where: str, recorded: Mapping[str, Any], actual: Mapping[str, Any]
                 ) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        left = without_fields(recorded, self.ignore)
        right = without_fields(actual, self.ignore)
        try:
            same = self.verify(left, right)
        except Exception as exc:
            raise _VerifierFailed(f"the verifier {self.name} raised at {where}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return None if same else (where, left, right)


class _VerifierFailed(Exception):
    """The ``--verify`` function raised: the episode cannot be judged, exit 2."""


async def _replay_one(url: str, episode: dict[str, Any], judge: _Judge,
                      timeout: float) -> dict[str, Any]:
    result: dict[str, Any] = {"episode_id": episode.get("episode_id"),
                              "where": episode.get("where"),
                              "steps": len(episode.get("steps") or ())}
    if episode.get("incomplete"):
        result["status"] = "incomplete"
        result["reason"] = episode.get("missing", "final part missing")
        return result
    if episode.get("redacted"):
        result["status"] = "redacted"
        return result
    if episode.get("unknown_steps") or episode.get("truncated"):
        result["status"] = "skipped"
        result["reason"] = ("steps of unknown outcome" if episode.get("unknown_steps")
                            else "truncated")
        return result
    client = _RawClient(url, timeout=timeout)
    at = "reset"
    try:
        reset = episode["reset"]
        try:
            answer: Any = await client.reset(**reset.get("kwargs", {}))
        except (ConnectError, HandshakeRejectedError) as exc:
            raise _Unreachable(str(exc)) from exc
        first = judge("reset", answer_of(reset), answer_of(split_answer(answer)))
        if first is None:
            for step in episode.get("steps") or ():
                at = f"step {step.get('index')}"
                answer = await client.step(step["action"])  # the data (_RawClient)
                first = judge(at, answer_of(step), answer_of(split_answer(answer)))
                if first is not None:
                    break
        if first is None:
            result["status"] = "reproduced"
        else:
            result["status"] = "differs"
            result["at"], result["recorded"], result["replayed"] = first
    except _Unreachable:
        raise
    except _VerifierFailed as exc:
        result["status"] = "error"
        result["error"] = str(exc)
    except (EnvlinkError, OSError) as exc:  # the server failed mid-episode
        result["status"] = "error"
        result["error"] = f"the server failed at {at}: {type(exc).__name__}: {exc}"
    finally:
        await client.close()
    return result


async def _replay_all(url: str, episodes: list[dict[str, Any]], judge: _Judge,
                      jobs: int, timeout: float) -> list[dict[str, Any]]:
    """Every episode's result; once the server cannot be reached for a reset, the
    episodes not begun yet are not run (``unreachable``)."""
    gate = asyncio.Semaphore(jobs)
    unreachable: list[str] = []

    async def one(episode: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            if unreachable:
                return {"episode_id": episode.get("episode_id"),
                        "where": episode.get("where"), "status": "unreachable",
                        "error": unreachable[0]}
            try:
                return await _replay_one(url, episode, judge, timeout)
            except _Unreachable as exc:
                unreachable.append(str(exc))
                return {"episode_id": episode.get("episode_id"),
                        "where": episode.get("where"), "status": "unreachable",
                        "error": str(exc)}

    return list(await asyncio.gather(*(one(e) for e in episodes)))


#: Each status, in the order the summary line gives them, and how it says them.
_STATUSES = (("reproduced", "reproduced"), ("differs", "differ"),
             ("error", "could not be judged (error)"), ("skipped", "skipped"),
             ("redacted", "cannot verify (redacted)"), ("incomplete", "incomplete"))


def replay_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``envlink replay`` with parsed arguments; the exit status."""
    report = RolloutFiles()
    try:
        judge = _Judge(args.verify, _verifier(args.verify), args.ignore)
        episodes = list(read_episodes(args.path, report))
    except (ValueError, ImportError, AttributeError, OSError) as exc:
        sys.stderr.write(f"envlink replay: error: {exc}\n")
        return 2
    report_bad_lines("envlink replay", report)
    episodes += report.incomplete
    if not episodes:
        sys.stderr.write(f"envlink replay: error: no recorded episode in {args.path}\n")
        return 2
    try:
        everything = asyncio.run(_replay_all(args.url, episodes, judge, args.jobs,
                                             args.timeout))
    except (ValueError, EnvlinkError) as exc:  # a malformed URL, ...
        sys.stderr.write(f"envlink replay: error: {exc}\n")
        return 2
    unreachable = [r for r in everything if r["status"] == "unreachable"]
    results = [r for r in everything if r["status"] != "unreachable"]
    if unreachable and not results:
        sys.stderr.write(f"envlink replay: cannot reach {args.url}: "
                         f"{unreachable[0]['error']}\n")
        return 2
    counts = {status: sum(r["status"] == status for r in results) for status, _ in _STATUSES}
    if args.json:
        sys.stdout.write(json.dumps({
            "episodes": len(results), **counts, "not_replayed": len(unreachable),
            "bad_lines": [{"file": str(b.file), "line": b.line, "reason": b.reason}
                          for b in report.bad_lines],
            "results": results}) + "\n")
    else:
        for r in results:
            name = f"episode {r['episode_id']} ({r['where']})"
            status = r["status"]
            if status == "reproduced":
                print(f"{name}: reproduced ({plural(r['steps'], 'step')})")
            elif status == "skipped":
                print(f"{name}: skipped ({r['reason']})")
            elif status == "redacted":
                print(f"{name}: cannot verify (redacted)")
            elif status == "incomplete":
                print(f"{name}: incomplete ({r['reason']}), not replayed")
            elif status == "error":
                print(f"{name}: could not be judged: {r['error']}")
            else:
                print(f"{name}: differs at {r['at']}")
                for line in side_by_side(r["recorded"], r["replayed"]):
                    print(line)
        said = [f"{counts[s]} {text}" for s, text in _STATUSES
                if counts[s] or s in ("reproduced", "differs")]
        print(f"{plural(len(results), 'episode')}: {', '.join(said)}")
    if unreachable:
        sys.stderr.write(f"envlink replay: cannot reach {args.url}: "
                         f"{unreachable[0]['error']}; {plural(len(unreachable), 'episode')} "
                         "not replayed\n")
        return 2
    if counts["error"]:
        first = next(r for r in results if r["status"] == "error")
        sys.stderr.write(f"envlink replay: {plural(counts['error'], 'episode')} could not "
                         f"be judged; the first: {first['error']}\n")
        return 2
    return 1 if counts["differs"] else 0
