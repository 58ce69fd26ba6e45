"""`qbridge inspect KIND FILE...`: what qbridge reads from legacy blobs saved to files, printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from bridge.commands.common import out
from bridge.errors import UnreadableBlob
from bridge.lifecycle.blob_inspect import INSPECTORS


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        blobs = [Path(f).read_bytes() for f in args.files]
    except OSError as e:
        raise UnreadableBlob(f"{e.filename}: {e.strerror}") from None
    try:
        result = INSPECTORS[args.kind](blobs)
    except ValueError as e:
        raise UnreadableBlob(f"{', '.join(args.files)}: {e}") from None
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.print_json(data=result)
    return 0
