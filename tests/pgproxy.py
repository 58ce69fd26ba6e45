"""A PostgreSQL wire-protocol proxy on 127.0.0.1 that cuts connections where a flaky network
would (issue 29): before a COMMIT reaches the server, after the server committed but before its
answer reaches the client (the client cannot know: in doubt), mid-COPY, mid-result; and that can
add latency or stall. asyncio, in a thread of its own; no dependency beyond the standard library.

The protocol (PostgreSQL docs, "Frontend/Backend Protocol"): after the startup packets (length
first, no type byte; an SSLRequest or GSSENCRequest is answered by the server with one byte),
every message is a type byte and a 4-byte length that counts itself. psycopg sends COMMIT as a
simple Query ('Q'); COPY data travels as CopyData ('d'); result rows as DataRow ('D'); the
server ends each exchange with ReadyForQuery ('Z').
"""

from __future__ import annotations

import asyncio
import random
import struct
import threading
from collections import Counter

SSL_REQUEST, GSS_REQUEST = 80877103, 80877104


class Cut(Exception):
    """This connection is cut here, as a network would."""


class FaultProxy:
    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432), seed: int = 7) -> None:
        self.upstream = upstream
        self.rng = random.Random(seed)
        self.cut_before_commit = 0.0  # probability a COMMIT never reaches the server
        self.cut_after_commit = 0.0  # probability the server commits and the answer is lost
        self.cut_copy_after: int | None = None  # one-shot: cut after this many CopyData messages
        self.cut_rows_after: int | None = None  # one-shot: cut after this many DataRows sent to a client
        self.latency = 0.0  # seconds added before each client message is forwarded
        self.counts: Counter[str] = Counter()
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    # -- control from the test's thread ------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def stall(self) -> None:
        """Nothing more is forwarded either way until `resume`."""
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def url(self, database: str = "test") -> str:
        return f"postgresql+psycopg://127.0.0.1:{self.port}/{database}"

    def _roll(self, p: float) -> bool:
        with self._lock:
            return p > 0 and self.rng.random() < p

    def _take(self, name: str) -> bool:
        """One-shot counters: True when the cut is due now."""
        with self._lock:
            left = getattr(self, name)
            if left is None:
                return False
            if left <= 0:
                setattr(self, name, None)
                return True
            setattr(self, name, left - 1)
            return False

    # -- the proxy ---------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _gate(self) -> None:
        while not self._open.is_set():
            await asyncio.sleep(0.01)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            c_writer.close()
            return
        state = {"in_doubt": False}
        try:
            await self._startup(c_reader, c_writer, s_reader, s_writer)
            await asyncio.gather(self._client_to_server(c_reader, s_writer, state),
                                 self._server_to_client(s_reader, c_writer, state))
        except (Cut, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (c_writer, s_writer):
                w.close()

    async def _startup(self, c_reader, c_writer, s_reader, s_writer) -> None:
        while True:
            head = await c_reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            rest = await c_reader.readexactly(length - 8)
            s_writer.write(head + rest)
            await s_writer.drain()
            if code in (SSL_REQUEST, GSS_REQUEST):  # answered with one byte ('N': no): then the real startup
                c_writer.write(await s_reader.readexactly(1))
                await c_writer.drain()
                continue
            return

    async def _client_to_server(self, reader, writer, state) -> None:
        while True:
            kind, body = await _message(reader)
            await self._gate()
            if self.latency:
                await asyncio.sleep(self.latency)
            if kind == b"Q" and body[4:].lstrip().upper().startswith(b"COMMIT"):
                self.counts["commits"] += 1
                if self._roll(self.cut_before_commit):
                    self.counts["cut before commit"] += 1
                    raise Cut()
                if self._roll(self.cut_after_commit):
                    state["in_doubt"] = True
            elif kind == b"d" and self._take("cut_copy_after"):
                self.counts["cut mid-copy"] += 1
                raise Cut()
            writer.write(kind + body)
            await writer.drain()

    async def _server_to_client(self, reader, writer, state) -> None:
        while True:
            kind, body = await _message(reader)
            await self._gate()
            if state["in_doubt"]:
                if kind == b"Z":  # the server committed; its answer is lost with the connection
                    self.counts["cut after commit"] += 1
                    raise Cut()
                continue
            if kind == b"D" and self._take("cut_rows_after"):
                self.counts["cut mid-result"] += 1
                raise Cut()
            writer.write(kind + body)
            await writer.drain()


async def _message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readexactly(5)
    (length,) = struct.unpack("!i", head[1:])
    return head[:1], head[1:] + await reader.readexactly(length - 4)
