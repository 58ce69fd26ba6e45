"""Reading settings: TOML files into pydantic models with errors that name the file and the key, and
the HOST:PORT a listener is given."""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from bridge.errors import ConfigError, UsageError

M = TypeVar("M", bound=BaseModel)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def read_toml(path: Path) -> dict[str, Any]:
    """Parses `path`; a missing file or a TOML syntax error is a ConfigError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), ["file not found"]) from None
    except OSError as e:
        raise ConfigError(str(path), [f"cannot read: {e.strerror}"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), [f"not valid TOML: {e}"]) from None


def expand_env(data: Any, path: str, where: str = "") -> Any:
    """Replaces `${NAME}` (or `${NAME:-default}`) in every string value from the environment."""
    if isinstance(data, dict):
        return {k: expand_env(v, path, f"{where}.{k}" if where else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env(v, path, f"{where}[{i}]") for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data

    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            if m.group(2) is not None:
                return m.group(2)
            raise ConfigError(path, [f"{where}: environment variable {m.group(1)} is not set (referenced as ${{{m.group(1)}}})"])
        return value

    return _VAR.sub(sub, data)


def validate(model: type[M], data: dict[str, Any], path: str) -> M:
    """Builds `model` from `data`; every validation problem becomes one located line."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(path, [_describe(err) for err in e.errors()]) from None


def _describe(err: Any) -> str:
    loc = ""
    for part in err["loc"]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    if err["type"] not in ("missing", "extra_forbidden") and "input" in err and not isinstance(err["input"], dict):
        msg += f" (got {err['input']!r})"
    return f"{loc or '(top level)'}: {msg}"


# -- the HOST:PORT a `qbridge run` listens on: parsed where the config is read and where the listener
# starts, so it sits below both (config must not import the metrics server)
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
