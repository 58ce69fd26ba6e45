"""Fixtures the reviews of the OpenJMS drain's reserve share (sessions 10 and 11): an OpenJMS store
whose walks keep a reserve of three batches of three."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.pipeline import passes
from tests.pipeline.test_scan_reserve import QUEUE
from tests.systems.test_openjms_source import Jms, make_jms


def _jms(server: str, request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
         monkeypatch: pytest.MonkeyPatch, mode: str = "copy") -> Iterator[Jms]:
    monkeypatch.setattr(passes, "SCAN_RESERVE", 9)  # a walk keeps three batches of three
    yield from make_jms(server, request, tmp_path, pg_server, pg_schema, mode=mode, batch_size=3, queues=[QUEUE])


@pytest.fixture
def pgjms(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Jms]:
    yield from _jms("postgres", request, tmp_path, pg_server, pg_schema, monkeypatch)


@pytest.fixture
def pgjms_move(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[Jms]:
    yield from _jms("postgres", request, tmp_path, pg_server, pg_schema, monkeypatch, mode="move")


@pytest.fixture(params=["postgres", "mariadb"])
def anyjms(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Jms]:
    yield from _jms(request.param, request, tmp_path, pg_server, pg_schema, monkeypatch)
