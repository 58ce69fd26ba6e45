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
