"""The headers of an NServiceBus SQL-transport row, as the transports write them."""

from __future__ import annotations

import orjson


def headers_json(headers: dict[str, str]) -> str:
    """The flat JSON object the transports write; `/` escaped as DataContractJsonSerializer does."""
    # Escaped in the bytes: replacing in the decoded text costs twice as much.
    return orjson.dumps(headers).replace(b"/", b"\\/").decode("utf-8")
