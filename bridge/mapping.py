"""Mapping files: routes, header rules, type names and what each legacy state becomes."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bridge.errors import ConfigError
from bridge.identifiers import check_name
from bridge.mapping_rules import BodyRule, HeaderRule, RouteRule, SkipRule, TransformRule, TtbrRule, TypeRule
from bridge.settings_io import read_toml, validate

Action = Literal["queue", "delayed", "error", "audit", "skip"]
TEMPLATE_FIELDS = {"system", "database", "queue", "key", "message_id", "destination", "state", "type"}
_PLACEHOLDER = re.compile(r"\{([a-z_]+)(?::([^{}]+))?\}")


class HeaderDrop(BaseModel):
    model_config = ConfigDict(extra="forbid")
    names: list[str] = Field(default_factory=list)


class HeaderRules(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rename: dict[str, str] = Field(default_factory=dict)
    set: dict[str, str] = Field(default_factory=dict)
    drop: HeaderDrop = Field(default_factory=HeaderDrop)

    @field_validator("set")
    @classmethod
    def _templates(cls, value: dict[str, str]) -> dict[str, str]:
        for name, template in value.items():
            check_template(template, name)
        return value


class States(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ready: Action = "queue"
    delayed: Action = "delayed"
    failed: Action = "error"
    processed: Literal["skip", "audit"] = "skip"
    expired: Literal["skip", "audit", "error"] = "skip"


class JmsOptions(BaseModel):
    """OpenJMS only: where JMS headers and properties go among the NServiceBus headers."""

    model_config = ConfigDict(extra="forbid")
    header_prefix: str = Field(default="JMS.", min_length=1)


class BizTalkOptions(BaseModel):
    """BizTalk only: header names of context namespaces, and how to read subscriptions."""

    model_config = ConfigDict(extra="forbid")
    namespaces: dict[str, str] = Field(default_factory=dict)  # namespace URI -> header prefix
    # uidPropID of BTS.MessageType in the EqualsPredicates table (bt_DocumentSpec.id in BizTalkMgmtDb)
    message_type_property_id: str | None = None

    @field_validator("message_type_property_id")
    @classmethod
    def _guid(cls, value: str | None) -> str | None:
        if value is not None:
            import uuid

            uuid.UUID(value)
        return value


class Mapping(BaseModel):
    """One mapping file, validated before anything runs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    routes: dict[str, str] = Field(default_factory=dict)
    headers: HeaderRules = Field(default_factory=HeaderRules)
    types: dict[str, str] = Field(default_factory=dict)
    # `[[types.rules]]` and `[[routes.rules]]` sit in their tables in the file; kept apart here
    # (bridge.mapping_rules), under the names their errors are located by.
    type_rules: list[TypeRule] = Field(default_factory=list, alias="types.rules")
    route_rules: list[RouteRule] = Field(default_factory=list, alias="routes.rules")
    skip: list[SkipRule] = Field(default_factory=list)
    header_rules: list[HeaderRule] = Field(default_factory=list, alias="headers.rules")
    body: list[BodyRule] = Field(default_factory=list)
    ttbr: list[TtbrRule] = Field(default_factory=list)
    transforms: list[TransformRule] = Field(default_factory=list)
    states: States = Field(default_factory=States)
    jms: JmsOptions = Field(default_factory=JmsOptions)
    biztalk: BizTalkOptions = Field(default_factory=BizTalkOptions)

    @model_validator(mode="before")
    @classmethod
    def _rule_lists(cls, data: object) -> object:
        if isinstance(data, dict):
            data = dict(data)
            for table in ("types", "routes", "headers"):
                entries = data.get(table)
                if isinstance(entries, dict) and "rules" in entries:
                    entries = dict(entries)
                    data[f"{table}.rules"] = entries.pop("rules")
                    data[table] = entries
        return data

    @field_validator("routes")
    @classmethod
    def _route_targets(cls, value: dict[str, str]) -> dict[str, str]:
        for legacy, queue in value.items():
            check_name(queue, f"route target of {legacy!r}")
        return value

    @model_validator(mode="after")
    def _has_routes(self) -> Mapping:
        if not self.routes and not self.route_rules:
            raise ValueError("[routes] is empty: add at least one 'legacy name' = 'TargetQueue' (or '*')")
        return self

    @model_validator(mode="after")
    def _rule_templates(self) -> Mapping:
        for i, rule in enumerate(self.header_rules):
            for name, template in rule.set.items():
                try:
                    check_template(template, name)
                except ValueError as e:
                    raise ValueError(f"headers.rules[{i}].set: {e}") from None
        return self

    @property
    def has_rules(self) -> bool:
        """Whether any rule of issue 47 applies per message (the envelope then builds its facts)."""
        return bool(self.route_rules or self.skip or self.reshapes)

    def rule_kinds(self) -> list[str]:
        """The rule tables of issue 47 this mapping has, as the file names them."""
        kinds = {"types.rules": self.type_rules, "routes.rules": self.route_rules, "skip": self.skip,
                 "headers.rules": self.header_rules, "body": self.body, "ttbr": self.ttbr, "transforms": self.transforms}
        return [name for name, rules in kinds.items() if rules]

    @property
    def rewrites_bodies(self) -> bool:
        """Whether rules change a body or read one's fields into headers (the lane then keeps the bodies it parsed)."""
        return bool(self.body or any(r.from_body for r in self.header_rules))

    @property
    def reshapes(self) -> bool:
        """Whether rules change a message's headers, body or expiry after [headers] (bridge.targets.reshape)."""
        return bool(self.header_rules or self.body or self.ttbr or self.transforms)

    def route(self, candidates: list[str]) -> str | None:
        """The target queue of the first candidate with a route, else the `*` route."""
        for name in candidates:
            if name in self.routes:
                return self.routes[name]
        return self.routes.get("*")

    def map_type(self, legacy_type: str) -> str:
        return self.map_types(legacy_type)[0]

    def type_rule_of(self, legacy_type: str) -> int | None:
        """The index of the `[[types.rules]]` entry that maps `legacy_type` (None: an exact entry or none does)."""
        if legacy_type in self.types:
            return None
        return next((i for i, rule in enumerate(self.type_rules) if rule.apply(legacy_type) is not None), None)

    def map_types(self, legacy_type: str) -> list[str]:
        """[types] first (exact), then `[[types.rules]]` in file order (the first that matches
        wins; a list `to` is an EnclosedMessageTypes chain); else the type as it is."""
        if legacy_type in self.types:
            return [self.types[legacy_type]]
        for rule in self.type_rules:
            mapped = rule.apply(legacy_type)
            if mapped is not None:
                return mapped
        return [legacy_type]

    def map_topic(self, full_name: str) -> str:
        """A subscription topic (Type.FullName) through [types], whose keys carry assemblies."""
        for legacy, mapped in self.types.items():
            if legacy.split(",")[0].strip() == full_name:
                return mapped.split(",")[0].strip()
        return full_name

    def target_queues(self) -> list[str]:
        return sorted(set(self.routes.values()) | {r.to for r in self.route_rules})

    def dropped(self, header: str) -> bool:
        return self._drop_re is not None and self._drop_re.match(header) is not None

    def header_target(self, header: str, translated: frozenset[str]) -> str | None:
        """The name a legacy header travels under, or None when it is dropped or is one the
        source translates into NServiceBus fields itself (a rename still applies to those)."""
        memo: dict[tuple[str, frozenset[str]], str | None] = self.__dict__.setdefault("_target_memo", {})
        key = (header, translated)
        if key in memo:
            return memo[key]
        if self.dropped(header):
            target = None
        elif header in self.headers.rename:
            target = self.headers.rename[header]
        else:
            target = None if header in translated else header
        if len(memo) < 10_000:  # this runs per header per message; names repeat, floods are not kept
            memo[key] = target
        return target

    @property
    def _drop_re(self) -> re.Pattern[str] | None:
        # One compiled alternation instead of fnmatch per pattern per header: this runs per message.
        cached = self.__dict__.get("_drop_compiled", False)
        if cached is False:
            names = self.headers.drop.names
            cached = re.compile("|".join(fnmatch.translate(n) for n in names)) if names else None
            self.__dict__["_drop_compiled"] = cached
        return cached


def check_template(template: str, header: str) -> None:
    """Every `{placeholder}` in a [headers.set] value must be one qbridge can fill."""
    for m in _PLACEHOLDER.finditer(template.replace("{{", "").replace("}}", "")):
        field, arg = m.group(1), m.group(2)
        if field == "header" and arg:
            continue
        if field not in TEMPLATE_FIELDS or arg:
            known = ", ".join(sorted(TEMPLATE_FIELDS | {"header:NAME"}))
            raise ValueError(f"header {header!r}: unknown placeholder {{{m.group(0)[1:-1]}}} (known: {known})")


def render_template(template: str, values: dict[str, str], headers: dict[str, str]) -> str:
    """Fills `{field}` and `{header:Name}` placeholders; `{{` and `}}` are literal braces."""
    if "{" not in template:
        return template

    def sub(m: re.Match[str]) -> str:
        if m.group(1) == "header":
            return headers.get(m.group(2) or "", "")
        return values.get(m.group(1), "")

    parts = template.split("{{")
    return "{".join("}".join(_PLACEHOLDER.sub(sub, s) for s in p.split("}}")) for p in parts)


def load_mapping(path: Path) -> Mapping:
    """Reads and validates a mapping file; every problem is reported with the file's name."""
    data = read_toml(path)
    mapping = validate(Mapping, data, str(path))
    if not mapping.routes and not mapping.route_rules:
        raise ConfigError(str(path), ["[routes] is empty"])
    return mapping
