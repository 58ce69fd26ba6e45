"""What a reload changes in a job, in words for its log line (issue 46.8): each setting of the
job's table with its old and new value, and each section of its mapping that changed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

SHOWN = 60  # characters of a value in the line; a longer one (a mapping section) is named only


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True, exclude_none=False)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _shown(value: Any) -> str:
    text = "unset" if value is None else repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN - 1] + "…"


def changes(old_job: BaseModel, new_job: BaseModel, old_mapping: BaseModel, new_mapping: BaseModel) -> list[str]:
    """'max_rate: '2/s' -> '5/s'', 'mapping [routes] changed', ...; empty when nothing did."""
    said = []
    before, after = _flat(old_job), _flat(new_job)
    for key in sorted(before.keys() | after.keys()):
        if before.get(key) != after.get(key):
            said.append(f"{key}: {_shown(before.get(key))} -> {_shown(after.get(key))}")
    old_m = old_mapping.model_dump(mode="json", by_alias=True)
    new_m = new_mapping.model_dump(mode="json", by_alias=True)
    for section in sorted(old_m.keys() | new_m.keys()):
        if old_m.get(section) != new_m.get(section):
            said.append(f"mapping [{section}] changed")
    return said
