"""The ledger of increasing keys (NGinn message ids) as ranges: one row per block of 1,024
keys of a queue, with one bit per key for each outcome: delivered, skipped by a rule, or
quarantined (issue 27).

A million delivered NGinn messages take ~980 rows of ~420 bytes, where the per-message ledger
took a million rows of ~184 bytes. A quarantined message also keeps its per-message entry (its
reason; its row waits in the quarantine), and a replay or discard changes that entry, not the
bit: where a key has both, the entry says what became of it (`State.known`). A key that was a
gap when its neighbours were recorded (a late commit) has no bit until it is delivered itself.
Outcomes interleave freely: a block holds ready, skipped and delivered neighbours alike.

Two writers never both record a key: a batch locks its blocks (SELECT ... FOR UPDATE, or
UPDLOCK on SQL Server; SQLite's writers hold the database lock from BEGIN IMMEDIATE) and
refuses (`AlreadyRecorded`) when any of its keys has a bit set already; a block that does not
exist yet is inserted, and the primary key (origin, block) refuses the second of two writers
inserting it. Either refusal rolls the batch back, which is retried with a fresh lookup, as a
duplicate ledger key always was.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from bridge.targets.bulk import insert_values
from bridge.timefmt import naive_utc, utcnow

if TYPE_CHECKING:
    import numpy as np

RANGES = "qbridge_ledger_ranges"
SHIFT = 10  # 1,024 keys a block
BLOCK_KEYS = 1 << SHIFT
BLOCK_BYTES = BLOCK_KEYS // 8
MASK = BLOCK_KEYS - 1
CHUNK = 500  # blocks per statement: well under every driver's parameter cap
OUTCOMES = ("delivered", "skipped", "quarantined")
COLUMNS = ("origin", "block", *OUTCOMES, "at")


# SQL Server's LargeBinary is IMAGE, which it deprecates.
BITS = sa.LargeBinary(BLOCK_BYTES).with_variant(mssql.VARBINARY(BLOCK_BYTES), "mssql")


class AlreadyRecorded(Exception):
    """A batch's key has a bit set already: another writer recorded it since the batch looked."""


def ranges_table(schema: str | None, metadata: sa.MetaData, name: str = RANGES) -> sa.Table:
    return sa.Table(
        name, metadata,
        sa.Column("origin", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("block", sa.BigInteger(), primary_key=True, autoincrement=False),
        *(sa.Column(o, BITS, nullable=False) for o in OUTCOMES),
        sa.Column("at", sa.DateTime(), nullable=False),  # last written
        schema=schema,
    )


def bits_of(bits: bytes | None) -> int:
    """A stored block's bits of one outcome as an integer."""
    return int.from_bytes(bits, "little") if bits else 0


def _bytes(bits: int) -> bytes:
    return bits.to_bytes(BLOCK_BYTES, "little")


def keys_of(block: int, bits: int) -> Iterator[int]:
    """The keys whose bits are set in `bits` of `block`, ascending."""
    base = block << SHIFT
    while bits:
        low = bits & -bits
        yield base + low.bit_length() - 1
        bits ^= low


class Ranges:
    """The range ledger of one state schema."""

    def __init__(self, table: sa.Table) -> None:
        self.table = table

    def _read(self, conn: sa.Connection, origin: int, blocks: Sequence[int], lock: bool) -> dict[int, list[int]]:
        """block -> its bits per outcome (OUTCOMES' order)."""
        out: dict[int, list[int]] = {}
        stmt = _blocks_statement(self.table, lock)
        for start in range(0, len(blocks), CHUNK):
            for block, *bits in conn.execute(stmt, {"origin_": origin, "blocks_": list(blocks[start:start + CHUNK])}):
                out[block] = [bits_of(b) for b in bits]
        return out

    def lookup(self, conn: sa.Connection, origin: int, keys: Iterable[int]) -> dict[int, str]:
        """key -> the outcome its bit says, for those of `keys` with a bit set."""
        keys = list(keys)
        blocks = self._read(conn, origin, sorted({k >> SHIFT for k in keys}), False)
        out: dict[int, str] = {}
        for k in keys:
            b = blocks.get(k >> SHIFT)
            if b is not None:
                bit = 1 << (k & MASK)
                for outcome, bits in zip(OUTCOMES, b):
                    if bits & bit:
                        out[k] = outcome
                        break
        return out

    def mark(self, conn: sa.Connection, origin: int, outcomes: Iterable[tuple[int, str]], merge: bool = False,
             arrays: Iterable[tuple[np.ndarray, str]] = ()) -> None:
        """Sets the bits of (key, outcome), and of each key of (keys, outcome) in `arrays` (the
        columnar lane's, bridge.ledger.lane_entries), in the caller's transaction. Refuses with
        AlreadyRecorded when a key has a bit already, unless `merge` (init folding per-message
        entries in: a key with a bit keeps it)."""
        new: dict[int, list[int]] = defaultdict(lambda: [0] * len(OUTCOMES))
        for key, outcome in outcomes:
            new[key >> SHIFT][OUTCOMES.index(outcome)] |= 1 << (key & MASK)
        for keys, outcome in arrays:
            at = OUTCOMES.index(outcome)
            for block, set_bits in block_bits(keys):
                new[block][at] |= set_bits
        if not new:
            return
        blocks = sorted(new)
        # Locked in block order, so two writers sharing blocks take them in the same order.
        old = self._read(conn, origin, blocks, True)
        now = naive_utc(utcnow())
        updates, inserts = [], []
        for block in blocks:
            bits = new[block]
            if block not in old:
                inserts.append((origin, block, *map(_bytes, bits), now))
                continue
            had = _any(old[block])
            if had & _any(bits) and not merge:
                raise AlreadyRecorded(f"key {next(keys_of(block, had & _any(bits)))} recorded already")
            merged = [o | (n & ~had) for o, n in zip(old[block], bits)]
            updates.append((block, merged))
        self._update(conn, origin, updates, now)
        insert_values(conn, self.table, COLUMNS, inserts)

    def unmark(self, conn: sa.Connection, origin: int, keys: Iterable[int]) -> None:
        """Clears every bit of `keys` in the caller's transaction (a rollback withdrew their
        messages, so a later pass delivers them again)."""
        gone: dict[int, int] = defaultdict(int)
        for key in keys:
            gone[key >> SHIFT] |= 1 << (key & MASK)
        old = self._read(conn, origin, sorted(gone), True)
        self._update(conn, origin, [(block, [b & ~gone[block] for b in bits]) for block, bits in old.items()],
                     naive_utc(utcnow()))

    def _update(self, conn: sa.Connection, origin: int, blocks: Sequence[tuple[int, list[int]]], now: datetime) -> None:
        """Writes (block, bits per outcome) over existing rows, in one executemany."""
        if blocks:
            conn.execute(_update_statement(self.table),
                         [{"o_": origin, "b_": block, **{o: _bytes(b) for o, b in zip(OUTCOMES, bits)}, "at": now}
                          for block, bits in blocks])

    def stream(self, conn: sa.Connection, origin: int, beyond: int | None = None) -> Iterator[tuple[int, str]]:
        """(key, outcome) of every key with a bit (above `beyond`, if given), ascending; read a page
        of blocks at a time, each page a query of its own, so the caller may use `conn` between pages."""
        t = self.table
        after = None if beyond is None else ((beyond + 1) >> SHIFT) - 1  # the blocks from beyond's next key on
        while True:
            stmt = sa.select(t.c.block, *(t.c[o] for o in OUTCOMES)).where(t.c.origin == origin)
            if after is not None:
                stmt = stmt.where(t.c.block > after)
            page = conn.execute(stmt.order_by(t.c.block).limit(CHUNK)).all()
            for block, *raw in page:
                bits = [bits_of(b) for b in raw]
                for key in keys_of(block, _any(bits)):
                    if beyond is None or key > beyond:
                        bit = 1 << (key & MASK)
                        yield key, next(o for o, b in zip(OUTCOMES, bits) if b & bit)
            if len(page) < CHUNK:
                return
            after = page[-1][0]


def block_bits(keys: np.ndarray) -> Iterator[tuple[int, int]]:
    """(block, the bits of `keys` in it) of each block `keys` (integers, int64) fall in: the bits
    a key at a time would set, made 64 at a time (a word's keys OR-ed together by numpy), in
    memory proportional to the keys, however sparse."""
    import numpy as np  # only a lane's batch has arrays; the commands that make none do without numpy

    if not len(keys):
        return
    keys = np.asarray(keys, dtype=np.int64)
    words = keys >> 6  # a block is 16 words of 64 keys
    order = np.argsort(words, kind="stable")
    words = words[order]
    ones = np.left_shift(np.uint64(1), (keys[order] & 63).astype(np.uint64))
    starts = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    out: dict[int, int] = {}
    for word, bits in zip(words[starts].tolist(), np.bitwise_or.reduceat(ones, starts).tolist()):
        out[word >> 4] = out.get(word >> 4, 0) | bits << (64 * (word & 15))
    yield from out.items()


def _any(bits: Sequence[int]) -> int:
    out = 0
    for b in bits:
        out |= b
    return out


@lru_cache(maxsize=64)
def _blocks_statement(t: sa.Table, lock: bool) -> sa.Select:
    """The blocks' bits, in block order; `lock`: held until the transaction ends. Built once a
    table, not once a read (bridge.ledger.state says why)."""
    stmt = sa.select(t.c.block, *(t.c[o] for o in OUTCOMES)).where(
        t.c.origin == sa.bindparam("origin_"), t.c.block.in_(sa.bindparam("blocks_", expanding=True))).order_by(t.c.block)
    return stmt.with_for_update().with_hint(t, "WITH (UPDLOCK, ROWLOCK)", "mssql") if lock else stmt


@lru_cache(maxsize=64)
def _update_statement(t: sa.Table) -> sa.Update:
    return sa.update(t).where(t.c.origin == sa.bindparam("o_"), t.c.block == sa.bindparam("b_"))
