"""Time conversions: legacy local time to UTC, and NServiceBus's wire timestamp format."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Literal, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def zone(name: str) -> ZoneInfo:
    """The IANA zone called `name`; ValueError with the name when it does not exist."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ValueError(f"unknown time zone {name!r} (expected an IANA name such as 'Europe/Warsaw')") from e


def local_to_utc(value: datetime, tz: ZoneInfo) -> datetime:
    """Reads a naive legacy timestamp as wall-clock time in `tz`.

    In the autumn hour that occurs twice, the first occurrence is taken (fold=0): NGinn
    stores getdate() without an offset, so the two cannot be told apart.
    """
    if value.tzinfo is not None:
        return value.astimezone(UTC)
    return value.replace(tzinfo=tz).astimezone(UTC)


class LocalClock:
    """`local_to_utc` for many timestamps of one zone: the UTC offset is remembered per wall-clock
    minute (a queue's rows mostly share their minutes), so a timestamp costs a subtraction instead
    of a zone lookup. A minute with a transition inside it, and a fold=1 time, take the zone's
    own way; the result is always what `local_to_utc` gives (tested across DST changes)."""

    LIMIT = 100_000  # minutes remembered (~2 months of busy minutes; then the zone's own way)

    def __init__(self, tz: ZoneInfo) -> None:
        self.tz = tz
        # wall-clock minute number -> the naive instant whose distance from `value` is its UTC
        # time's distance from the epoch (epoch + UTC offset); None for a minute a transition cuts
        self._bases: dict[int, datetime | None] = {}

    def to_utc(self, value: datetime) -> datetime:
        if value.tzinfo is not None or value.fold:
            return local_to_utc(value, self.tz)
        # Integers and timedelta arithmetic throughout: datetime.replace costs ~0.5 us a call.
        minute = value.toordinal() * 1440 + value.hour * 60 + value.minute
        bases = self._bases
        base: datetime | None | Literal[False] = bases.get(minute, False)  # False: not looked up yet
        if base is False:
            start = datetime(value.year, value.month, value.day, value.hour, value.minute, tzinfo=self.tz)
            first = start.utcoffset()
            last = (start + _LAST_IN_MINUTE).utcoffset()
            base = _NAIVE_EPOCH + first if first is not None and first == last else None
            if len(bases) < self.LIMIT:
                bases[minute] = base
        if base is None:
            return local_to_utc(value, self.tz)
        return _UTC_EPOCH + (value - base)


_NAIVE_EPOCH = datetime(1970, 1, 1)
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_IN_MINUTE = timedelta(seconds=59, microseconds=999_999)


@overload
def naive_utc(value: datetime) -> datetime: ...
@overload
def naive_utc(value: None) -> None: ...
def naive_utc(value: datetime | None) -> datetime | None:
    """An aware time as the naive UTC value the databases' `timestamp`/`datetime2` columns hold."""
    return None if value is None else value.astimezone(UTC).replace(tzinfo=None)


def to_wire(value: datetime) -> str:
    """`yyyy-MM-dd HH:mm:ss:ffffff Z`, the format NServiceBus and ServiceControl parse strictly."""
    if value.tzinfo is None:
        raise ValueError("a wire timestamp needs a time zone")
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # %-formatting of the fields: a third of isoformat-and-slice's time, and this runs per message.
    return "%04d-%02d-%02d %02d:%02d:%02d:%06d Z" % (  # noqa: UP031 - see above
        value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond)


def from_wire(text: str) -> datetime:
    """Inverse of `to_wire`; as strict as NServiceBus's own parser (28 characters)."""
    if len(text) != 28 or text[19] != ":" or not text.endswith(" Z"):
        raise ValueError(f"not a NServiceBus wire timestamp: {text!r}")
    return datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S").replace(
        microsecond=int(text[20:26]), tzinfo=UTC
    )


def timespan(delta: timedelta) -> str:
    """.NET `TimeSpan.ToString()` ("c" format), as NServiceBus.TimeToBeReceived is written."""
    total_us = int(delta / timedelta(microseconds=1))
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    days, rem = divmod(total_us, 86_400_000_000)
    hours, rem = divmod(rem, 3_600_000_000)
    minutes, rem = divmod(rem, 60_000_000)
    seconds, micros = divmod(rem, 1_000_000)
    text = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    if days:
        text = f"{days}.{text}"
    if micros:
        text += f".{micros * 10:07d}"
    return sign + text


def parse_duration(text: str) -> float:
    """Seconds in "500ms", "5s", "15m", "2h", "1d"; ValueError naming the text otherwise."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (expected a number and ms, s, m, h or d, e.g. '5s')")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def utcnow() -> datetime:
    return datetime.now(UTC)


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")


def parse_rate(text: str) -> float:
    """Messages a second in "200/s", "12000/m", "50/h"; ValueError naming the text otherwise."""
    m = _RATE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a rate (expected a number above 0 per s, m or h, e.g. '200/s')")
    return float(m.group(1)) / _UNIT_SECONDS[m.group(2)]
