"""``envlink fleet status STORE``: the holders, waiters and limits of a fleet's store.

Reads a directory or Redis store (``FleetLimits(store=...)``) as the processes that
share it see it: per scope (an endpoint's sessions, the fleet's total, the provider
starts in flight), the slots held and by which processes, the live waiters, and the
limit now (lower than configured after a ``CAPACITY_REACHED``, until it grows back).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from envlink._errors import FleetStoreError, InvalidArgumentError
from envlink._fleet.settings import FleetLimits
from envlink._fleet.worker import open_store

__all__ = ["DESCRIPTION", "add_arguments", "fleet_from_args"]

DESCRIPTION = ("Look at the store of a fleet's shared limits (FleetLimits): holders, "
               "waiters and limits per endpoint.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``fleet`` subcommand's own subcommands and options."""
    actions = parser.add_subparsers(title="actions", dest="action", metavar="ACTION",
                                    required=True)
    status = actions.add_parser(
        "status", help="holders, waiters and limits per endpoint (envlink fleet status "
                       "--help)", description=DESCRIPTION)
    status.add_argument("store", metavar="STORE",
                        help="the store: a directory, or redis://host:port/db")
    status.add_argument("--json", action="store_true",
                        help="one JSON object per scope, one per line")


def fleet_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``envlink fleet status``; 0, or 1 when the store cannot be read."""
    try:
        limits = FleetLimits(args.store)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    try:
        if limits.kind == "directory" and not os.path.isdir(limits.store):
            raise InvalidArgumentError(f"no fleet store at {limits.store!r} (not a directory)")
        if limits.kind == "ray":
            raise InvalidArgumentError("a ray: store is read from inside its Ray cluster: "
                                       "use envlink._fleet's RayStore there")
        store = open_store(limits)
        try:
            scopes = store.status()
        finally:
            store.close()
    except (FleetStoreError, InvalidArgumentError) as exc:
        sys.stderr.write(f"envlink fleet status: {exc}\n")
        return 1
    if args.json:
        for scope in scopes:
            sys.stdout.write(json.dumps(scope.as_dict()) + "\n")
        return 0
    sys.stdout.write(f"store: {limits.shown_store}\n")
    if not scopes:
        sys.stdout.write("(nothing held or waiting yet)\n")
        return 0
    width = max(len(s.scope) for s in scopes)
    sys.stdout.write(f"{'SCOPE':<{width}}  HOLDERS  WAITERS  LIMIT  PROCESSES\n")
    for s in scopes:
        limit = "-" if s.limit is None else str(s.limit)
        sys.stdout.write(f"{s.scope:<{width}}  {s.holders:>7}  {s.waiters:>7}  {limit:>5}  "
                         f"{', '.join(s.processes)}\n")
    return 0
