"""The `HOST:PORT` a `qbridge run` listens on: parsed where the config is read and where the
listener starts, so it sits below both (config must not import the metrics server)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from bridge.errors import UsageError


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets); UsageError naming what is wrong."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port
        raise UsageError(f"--listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return host, int(port)


def loopback_host(header: str | None) -> bool:
    """Whether an HTTP Host header names this machine's loopback (or is absent, as from HTTP/1.0)."""
    if not header:
        return True
    try:
        name = urlsplit("//" + header).hostname
    except ValueError:
        return False
    return name is not None and is_loopback(name)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
