"""Table, schema and queue names that reach SQL: validated here, quoted by SQLAlchemy."""

from __future__ import annotations

import re

# NServiceBus queue names carry dots and hyphens ("Sales.Delayed", "Particular.ServiceControl");
# quote characters, semicolons and control characters never belong in one.
_ALLOWED = re.compile(r"^[^\x00-\x1f\x7f\"'`\[\];\\]+$")
MAX_LENGTH = 128


def check_name(name: object, what: str) -> str:
    """Returns `name` if it is safe to use as a quoted identifier; ValueError saying why not."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    if len(name) > MAX_LENGTH:
        raise ValueError(f"{what} {name[:40]!r}... is {len(name)} characters long (at most {MAX_LENGTH})")
    if name != name.strip():
        raise ValueError(f"{what} {name!r} starts or ends with white space")
    if not _ALLOWED.match(name):
        raise ValueError(f"{what} {name!r} contains a quote, bracket, semicolon, backslash or control character")
    return name


# What each database keeps of an identifier. PostgreSQL silently truncates longer ones, so two
# long queue names could land in one table: refuse them instead.
_LIMITS = {"postgresql": ("bytes", 63), "mysql": ("characters", 64), "mariadb": ("characters", 64),
           "mssql": ("characters", 128)}


def check_fits(name: str, backend: str, what: str) -> str:
    """Returns `name` if `backend` keeps it whole as an identifier; ValueError saying why not."""
    unit, limit = _LIMITS.get(backend, ("characters", 0))
    size = len(name.encode("utf-8")) if unit == "bytes" else len(name)
    if limit and size > limit:
        raise ValueError(f"{what} {name!r} is {size} {unit} long; {backend} identifiers hold at most {limit}")
    return name


def url_identity(url: str) -> str:
    """A database's default name in message ids and echo tags: the URL's database, or the
    SQLite file's stem."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = parsed.database or "default"
    if parsed.get_backend_name() == "sqlite":
        name = name.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0] or "default"
    return name
