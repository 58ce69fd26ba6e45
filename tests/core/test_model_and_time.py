"""The canonical model refuses guesses; times convert to NServiceBus's wire format."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
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
        assert message_id_for("nginn", "LegacyDb", "MQueue1", key) == expected


def test_batch_message_ids_equal_uuid5_and_behave_as_uuids() -> None:
    import pickle
    import uuid as _uuid

    from bridge.model import MESSAGE_ID_NAMESPACE, message_ids

    keys = ["1", "ID:abc#5", "zażółć", "x" * 300, "a/b/c", ""] + [str(n) for n in range(2000)]
    texts = message_ids("nginn", "Legacy/Db", "MQueue1", keys)
    for key, text in zip(keys, texts, strict=True):
        expected = _uuid.uuid5(MESSAGE_ID_NAMESPACE, f"nginn/Legacy/Db/MQueue1/{key}")
        assert text == str(expected)
    for key in keys[:6]:
        expected = _uuid.uuid5(MESSAGE_ID_NAMESPACE, f"nginn/Legacy/Db/MQueue1/{key}")
        u = message_id_for("nginn", "Legacy/Db", "MQueue1", key)
        assert u == expected and hash(u) == hash(expected) and u.version == 5 and u.variant == _uuid.RFC_4122
        assert str(u) == str(expected) and u.bytes == expected.bytes
        assert pickle.loads(pickle.dumps(u)) == expected  # they travel between Spark processes


@pytest.mark.parametrize(("zone_name", "day"), [
    ("Europe/Warsaw", "2026-03-29"), ("Europe/Warsaw", "2026-10-25"),  # the spring gap and the autumn fold
    ("Australia/Lord_Howe", "2026-04-05"), ("Australia/Lord_Howe", "2026-10-04"),  # 30-minute shifts
    ("America/Sao_Paulo", "2018-11-04"),  # DST that began at midnight
    ("Africa/Monrovia", "1972-01-07"),  # -0:44:30 -> UTC: a transition inside a minute
    ("Europe/Amsterdam", "1937-07-01"),  # +0:19:32 -> +0:20
    ("UTC", "2026-01-01"),
])
def test_local_clock_gives_what_local_to_utc_gives(zone_name: str, day: str) -> None:
    from bridge.timefmt import LocalClock, local_to_utc, zone

    tz = zone(zone_name)
    clock = LocalClock(tz)
    start = datetime.fromisoformat(day)
    step = timedelta(seconds=7, microseconds=12_345)
    value = start
    while value < start + timedelta(days=1):
        got, expected = clock.to_utc(value), local_to_utc(value, tz)
        assert got == expected and got.tzinfo is expected.tzinfo and got.utcoffset() == timedelta(0), value
        value += step
    folded = datetime(2026, 10, 25, 2, 30, fold=1)
    assert LocalClock(zone("Europe/Warsaw")).to_utc(folded) == local_to_utc(folded, zone("Europe/Warsaw"))
    aware = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=3)))
    assert clock.to_utc(aware) == datetime(2026, 1, 1, 9, tzinfo=timezone.utc)
    # The ends of datetime's range: the same value, or the same error, as the zone's own way.
    for edge in (datetime.min, datetime.max, datetime.min + timedelta(hours=14), datetime.max - timedelta(hours=14)):
        try:
            expected = local_to_utc(edge, tz)
        except OverflowError:
            with pytest.raises(OverflowError):
                LocalClock(tz).to_utc(edge)
        else:
            assert LocalClock(tz).to_utc(edge) == expected, edge


def test_row_ids_are_fresh_time_ordered_uuid7s() -> None:
    import time

    from bridge.model import row_ids

    before = time.time_ns() // 1_000_000
    first, second = row_ids(3000), row_ids(3000)
    after = time.time_ns() // 1_000_000
    for ids in (first, second):
        assert ids == sorted(ids)  # growing within a call
        assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
        assert all(before <= i.int >> 80 <= after for i in ids)  # 48 bits of Unix milliseconds
        assert all(uuid.UUID(str(i)) == i and hash(i) == hash(uuid.UUID(int=i.int)) for i in ids[:10])
    assert len(set(first) | set(second)) == 6000  # two calls in the same millisecond still differ
    assert row_ids(0) == []
    many = row_ids((1 << 20) + 3)  # more than the counter's 20 bits: a second random base
    assert len(set(many)) == len(many) and all(i.version == 7 for i in many[-5:])


def test_row_id_bytes_are_row_ids_packed() -> None:
    """The COPY's packed ids (numpy) are UUIDv7s of the same layout as row_ids', growing, distinct
    across calls and across a second base, with nothing carried into the high word."""
    import time

    from bridge.model import row_id_bytes

    before = time.time_ns() // 1_000_000
    for n in (0, 1, 3000, (1 << 20) + 3):
        packed = row_id_bytes(n)
        assert len(packed) == 16 * n
        ids = [uuid.UUID(bytes=packed[i:i + 16]) for i in range(0, len(packed), 16)]
        after = time.time_ns() // 1_000_000
        assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
        assert all(before <= i.int >> 80 <= after for i in ids)
        assert len(set(ids)) == n
        base = ids[:1 << 20]
        assert base == sorted(base) and all(b.int - base[0].int == k for k, b in enumerate(base[:5000]))
    assert row_id_bytes(5) != row_id_bytes(5)
