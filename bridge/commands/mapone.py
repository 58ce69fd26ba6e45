"""`qbridge map -c CONFIG --job NAME --queue QUEUE --key KEY [--json]`."""

from __future__ import annotations

import argparse
import sys

import orjson

from bridge.commands.common import out, runners_of
from bridge.errors import UsageError


def cmd_map(args: argparse.Namespace) -> int:
    from bridge.lifecycle.map_one import map_one

    if not args.job:
        raise UsageError("map shows one row of one job: give --job NAME")
    _, [runner] = runners_of(args)
    shown = map_one(runner, args.queue, args.key)
    if args.json:
        sys.stdout.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    say = lambda line: out.print(line, markup=False, highlight=False, soft_wrap=True)
    say(f"job {shown['job']} queue {shown['queue']} key {shown['key']} (message id {shown['message_id']})")
    say(f"rules applied: {', '.join(shown['rules']) or 'none'}")
    if shown["outcome"] != "delivered":
        say(f"{shown['outcome']}: {shown['reason']}")
        return 0
    say(f"delivered to {shown['table']}" + (f" ({shown['kind']})" if "kind" in shown else ""))
    if "headers" in shown:
        for name, value in shown["headers"].items():
            say(f"  {name}: {value}")
        say(f"expires: {shown['expires'] or 'never'}" + (f"; due {shown['due']}" if shown["due"] else ""))
        body = shown["body"]
        say("body: " + (orjson.dumps(body).decode() if not isinstance(body, str) else body))
    return 0
