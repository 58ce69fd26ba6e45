"""The legacy decoders side by side (issue 49): each golden vector of tests/fixtures read by the
pure-Python reader (the reference: openjms_fast.read for OpenJMS blobs, decode_context_python for
BizTalk context bags, context_fields_python for what BizTalkSource takes of a bag, and
decode_blocks_python for Parts' block streams) and by its compiled twin, interleaved, best of
--repeat rounds; prints µs a message for each and the ratio. Goal: the compiled reader at least
5x faster a message.

The fields run reads each bag again and again with one memo, as a queue whose bags share their
layout is read (the memo's best case; a bag of another layout reads as with none). A part's
blocks are zlib streams both readers inflate with zlib's C library: its inflate is the floor.

    python3 bench/decoders.py
    python3 bench/decoders.py --repeat 7 --loops 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bridge.codecs import biztalk, openjms_blob, openjms_fast
from bridge.sources.biztalk import header_text

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def best_of(fn: Callable[[bytes], object], blob: bytes, loops: int) -> float:
    started = time.perf_counter()
    for _ in range(loops):
        fn(blob)
    return (time.perf_counter() - started) / loops * 1e6


def fields_readers() -> tuple[Callable[[bytes], object], Callable[[bytes], object]]:
    """context_fields as BizTalkSource calls it, by the Python reader and by the compiled one with
    its memo: header names kept in `names` as the source keeps them."""
    names: dict[str, dict[str, str]] = {}

    def name_of(namespace: str, name: str) -> str:
        header = f"{namespace.rsplit('/', 1)[-1]}.{name}"
        names.setdefault(namespace, {})[name] = header
        return header

    def reference(blob: bytes) -> object:
        # context_fields_python reads the bag by the module's decode_context, which is the compiled
        # reader where it was built: the reference reads it by the pure-Python one throughout
        compiled_bag, biztalk.decode_context = biztalk.decode_context, biztalk.decode_context_python
        try:
            return biztalk.context_fields_python(blob, names, name_of, header_text)
        finally:
            biztalk.decode_context = compiled_bag

    memo: list[object] = []
    compiled = biztalk.COMPILED_FIELDS
    assert compiled is not None
    return reference, lambda blob: compiled(blob, names, name_of, header_text, memo)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--loops", type=int, default=2000)
    args = p.parse_args()
    if openjms_blob.COMPILED is None or biztalk.COMPILED_CONTEXT is None or biztalk.COMPILED_BLOCKS is None:
        sys.exit("the compiled readers are not built: pip install -e . on a machine with gcc and zlib1g-dev")
    bags = sorted((FIXTURES / "biztalk").glob("*ctx*.bin"))
    parts = sorted(p for p in (FIXTURES / "biztalk").glob("*.bin") if "part" in p.name or "frag" in p.name)
    kinds = [("OpenJMS blob", sorted((FIXTURES / "openjms").glob("*.bin")), openjms_fast.read, openjms_blob.COMPILED),
             ("BizTalk context", bags, biztalk.decode_context_python, biztalk.COMPILED_CONTEXT),
             ("BizTalk context fields", bags, *fields_readers()),
             ("BizTalk part blocks", parts, biztalk.decode_blocks_python, biztalk.COMPILED_BLOCKS)]
    for kind, paths, reference, compiled in kinds:
        print(f"{kind}: µs a message, best of {args.repeat} rounds of {args.loops}")
        print(f"  {'vector':42} {'bytes':>7} {'reference':>10} {'compiled':>9} {'ratio':>6}")
        ratios = []
        for path in paths:
            blob = path.read_bytes()
            assert repr(reference(blob)) == repr(compiled(blob)), f"{path.name}: the two readers disagree"
            loops = max(20, args.loops * 2000 // max(len(blob), 2000))
            slow = fast = float("inf")
            for _ in range(args.repeat):  # interleaved: a drift of the machine touches both
                slow = min(slow, best_of(reference, blob, loops))
                fast = min(fast, best_of(compiled, blob, loops))
            ratios.append(slow / fast)
            print(f"  {path.name[:42]:42} {len(blob):7,} {slow:10.1f} {fast:9.1f} {slow / fast:5.1f}x", flush=True)
        print(f"  {kind}: median ratio {statistics.median(ratios):.1f}x, least {min(ratios):.1f}x over {len(ratios)} vectors")


if __name__ == "__main__":
    main()
