"""Plugins for the mapping tests' [[transforms]] (pure: the same message in, the same out)."""

from __future__ import annotations

from typing import Any


def fix_order(message: dict[str, Any]) -> dict[str, Any] | None:
    body = message["body"]
    if isinstance(body, dict) and body.get("Cancelled"):
        return None  # skipped, counted under the rule's position
    if isinstance(body, dict) and body.get("Explode"):
        raise ValueError("cannot fix an exploding order")
    message["headers"]["Acme.Fixed"] = "yes"
    if isinstance(body, dict):
        body["Fixed"] = True
    return message


def stamp(message: dict[str, Any]) -> dict[str, Any]:
    """Not pure: a new value each time (what verify --deep must point at)."""
    import uuid

    message["headers"]["Acme.Stamp"] = str(uuid.uuid4())
    return message
