"""What a BizTalk context bag holds, shared by its two readers: biztalk, and the compiled
biztalk_native (which must not import biztalk: biztalk imports it). The layout's constants, a
property, and the value types that take more than a struct to read.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

CLSID_C4 = bytes.fromhex("C4E0906C1849D311A24200C04F60A533")
CLSID_D4 = bytes.fromhex("D4E0906C1849D311A24200C04F60A533")
VT_ARRAY = 0x2000
MAX_ITEMS = 1_000_000
MAX_BLOCK = 1 << 20  # BizTalk writes at most 35,840 bytes a block; anything near this is corrupt
OLE_EPOCH = datetime(1899, 12, 30)


class BizTalkFormatError(ValueError):
    """A context bag or part stream that does not follow the MessageBox layout."""


SYSTEM_NS = "http://schemas.microsoft.com/BizTalk/2003/system-properties"
ERROR_NS = "http://schemas.microsoft.com/BizTalk/2005/error-report"


class ContextProperty(NamedTuple):
    """One property of a context bag. A tuple, not a frozen dataclass: a bag holds dozens and every
    message's bag is read, and a frozen dataclass takes ~2 µs to make, a tuple ~0.2 (issue 49)."""

    name: str
    namespace: str
    vt: int
    context_property_type: int
    is_array: bool
    value: Any

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "vt": self.vt,
                "context_property_type": self.context_property_type, "is_array": self.is_array, "value": self.value}


def ole_date(value: float) -> str:
    """An OLE Automation date (days since 1899-12-30; the fraction is the time even below zero) as ISO text."""
    if math.isnan(value) or abs(value) > 2_958_466:  # or past year 9999
        raise BizTalkFormatError(f"VT_DATE {value!r} is out of range")
    days = int(value)
    ms = round(abs(value - days) * 86_400_000)
    dt = OLE_EPOCH + timedelta(days=days, milliseconds=ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}"


def currency(units: int) -> str:
    """VT_CY, an int64 in units of 1/10000, as decimal text."""
    return str(Decimal(units) / 10000)
