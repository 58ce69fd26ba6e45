"""The canonical model refuses guesses; times convert to NServiceBus's wire format."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from bridge.model import CanonicalMessage, SourceRef, message_id_for
from bridge.timefmt import from_wire, local_to_utc, parse_duration, timespan, to_wire

SRC = SourceRef(system="nginn", database="db", queue="Q", key="1")


def _msg(**kw: object) -> CanonicalMessage:
    base = {"message_id": uuid.uuid4(), "source": SRC, "state": "ready", "destination": "Q", "time_sent": datetime.now(UTC)}
    return CanonicalMessage(**{**base, **kw})


def test_valid_message() -> None:
    assert _msg(headers={"a": "b"}, body=b"x").headers == {"a": "b"}


@pytest.mark.parametrize("bad", [
    {"time_sent": datetime(2024, 1, 1)},  # no zone
    {"due": datetime(2024, 1, 1)},
    {"destination": ""},
    {"headers": {"n": 1}},  # not a string
    {"state": "weird"},
    {"body": "text, not bytes"},
])
def test_invalid_messages_are_errors_not_guesses(bad: dict) -> None:
    with pytest.raises(ValidationError):
        _msg(**bad)


def test_message_ids_are_deterministic_and_distinct() -> None:
    a = message_id_for("nginn", "db", "Q", "1")
    assert a == message_id_for("nginn", "db", "Q", "1")
    assert a != message_id_for("nginn", "db", "Q", "2") != message_id_for("nginn", "db2", "Q", "1")


def test_wire_format_round_trip() -> None:
    t = datetime(2016, 8, 16, 10, 6, 20, 123456, tzinfo=UTC)
    assert to_wire(t) == "2016-08-16 10:06:20:123456 Z"
    assert from_wire(to_wire(t)) == t
    with pytest.raises(ValueError):
        from_wire("2016-08-16T10:06:20Z")


def test_local_time_across_dst() -> None:
    warsaw = ZoneInfo("Europe/Warsaw")
    assert local_to_utc(datetime(2024, 1, 15, 12, 0), warsaw) == datetime(2024, 1, 15, 11, 0, tzinfo=UTC)
    assert local_to_utc(datetime(2024, 7, 15, 12, 0), warsaw) == datetime(2024, 7, 15, 10, 0, tzinfo=UTC)
    # 02:30 on 27 Oct 2024 happened twice; the first (summer time) is taken
    assert local_to_utc(datetime(2024, 10, 27, 2, 30), warsaw) == datetime(2024, 10, 27, 0, 30, tzinfo=UTC)


def test_timespan_and_durations() -> None:
    assert timespan(timedelta(minutes=1)) == "00:01:00"
    assert timespan(timedelta(days=2, hours=3, seconds=4.5)) == "2.03:00:04.5000000"
    assert parse_duration("15m") == 900 and parse_duration("500ms") == 0.5
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("soon")


def test_message_ids_are_rfc_4122_uuid5() -> None:
    import uuid as _uuid

    from bridge.model import MESSAGE_ID_NAMESPACE, message_id_for

    for key in ("1", "ID:abc#5", "zażółć", "x" * 300, "a/b/c"):
        expected = _uuid.uuid5(MESSAGE_ID_NAMESPACE, f"nginn/LegacyDb/MQueue1/{key}")
        assert message_id_for.__wrapped__("nginn", "LegacyDb", "MQueue1", key) == expected
