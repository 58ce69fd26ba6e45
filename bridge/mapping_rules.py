"""Rules of a mapping file that reshape messages by pattern and by content (issue 47): type rules
by regular expression, routes and skips decided by a `when`, a CEL expression over the legacy
message as read. Compiled and type-checked when the mapping loads: a bad one is a located error
before anything runs.

CEL (the Common Expression Language of Kubernetes and Envoy) is evaluated by cel-expr-python,
Google's CEL C++ behind a thin binding: type-checked at compile time, errors as values at run
time (a header or field a `when` names that a message lacks is an error value, which does not
match), ~5 µs a message. CEL reserves `type` (its type() function); the contract names the legacy
type `type`, so the expression is compiled with `type` spelled `_typ` where it is a variable
(same length: the positions in CEL's messages stay right), and the messages say `type` again."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from importlib.metadata import entry_points
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bridge.errors import ConfigError
from bridge.identifiers import check_name

TYPE_VAR = "_typ"  # `type` as the compiled expression spells it
# `type` the variable: not a call (type(x)), not a field (headers.type, body.type: no rename there)
_STRINGS_OR_TYPE = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?<![.\w])(?<!\.\s)(?<!\.\s\s)\btype\b(?!\s*\()""")
_GROUP_REF = re.compile(r"\\(\d+)|\\g<(\d+)>")
_ENV: Any = None


def _env() -> Any:
    """One CEL environment for every `when`: the variables a message offers, typed."""
    global _ENV
    if _ENV is None:
        from cel_expr_python import cel

        t = cel.Type
        _ENV = cel.NewEnv(variables={"system": t.STRING, "queue": t.STRING, "destination": t.STRING, "state": t.STRING,
                                     TYPE_VAR: t.STRING, "headers": t.Map(t.STRING, t.STRING), "body": t.DYN})
    return _ENV


def _spelled(expression: str) -> str:
    return _STRINGS_OR_TYPE.sub(lambda m: m.group(1) or TYPE_VAR, expression)


class When:
    """A compiled `when`: `matches(message)` is True only where it evaluates to true."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            self._compiled = _env().compile(_spelled(expression))
        except RuntimeError as e:
            said = str(e).replace(TYPE_VAR, "type").replace("[INVALID_ARGUMENT]", "").strip()
            said = re.sub(r"^INVALID_ARGUMENT: ", "", said)
            raise ValueError(f"`when` does not compile: {' '.join(said.split())}") from None
        returns = self._compiled.return_type().name()
        if returns not in ("BOOL", "DYN"):  # DYN: a body field, whose type only the message tells
            raise ValueError(f"`when` must be true or false, and {expression!r} is of type {returns.lower()}")
        code = _STRINGS_OR_TYPE.sub(lambda m: '""' if m.group(1) else m.group(0), expression)  # string literals blanked
        self.reads_body = re.search(r"\bbody\b", code) is not None
        # Reads only system, queue, destination, state, type and which headers there are (`"X" in
        # headers`, a literal name): what every message of a columnar lane group shares (its header
        # names are part of its key), so the group's example decides for all of them.
        names_only = re.sub(r'""\s+in\s+headers\b', "", code)
        self.per_group = not self.reads_body and re.search(r"\bheaders\b", names_only) is None

    def matches(self, message: MessageFacts) -> bool:
        forced = FORCED.get()
        if forced is not None:  # a columnar lane group's example: the lane evaluated this over its rows
            return forced[id(self)]
        return self.evaluate(message)

    def evaluate(self, message: MessageFacts) -> bool:
        # an error value (a key absent) is no match: its value is its message, never True
        return self._compiled.eval(message.activation(self.reads_body)).value() is True


# Set while the columnar lane runs a group's example: what every `when` holds for the group's
# rows, by id(When); the lane split its groups by those outcomes (bridge.targets.lane_rules).
FORCED: ContextVar[dict[int, bool] | None] = ContextVar("qbridge_when_forced", default=None)


class MessageFacts:
    """What a `when` sees of one message: as read, before any rule changed it. The body is
    parsed once, and only for expressions that read it; one that is not JSON is absent."""

    __slots__ = ("_activations", "_body", "_facts", "_parsed")

    def __init__(self, system: str, queue: str, destination: str, state: str, legacy_type: str, headers: dict[str, str],
                 body: bytes | None) -> None:
        self._facts: dict[str, Any] = {"system": system, "queue": queue, "destination": destination, "state": state,
                                       TYPE_VAR: legacy_type, "headers": headers}
        self._body, self._parsed = body, False
        self._activations: dict[bool, Any] = {}

    def activation(self, with_body: bool) -> Any:
        """The CEL activation of these facts, made once a message (a few µs: every rule shares it)."""
        found = self._activations.get(with_body)
        if found is None:
            if with_body and not self._parsed:
                self._parsed = True
                try:
                    self._facts["body"] = orjson.loads(self._body) if self._body else None
                except orjson.JSONDecodeError:
                    pass  # not JSON: `body` is absent, and a `when` that reads it does not match
                if self._facts.get("body") is None:
                    self._facts.pop("body", None)
            found = self._activations[with_body] = _env().Activation(self._facts)
        return found


def _when(value: str | None) -> str | None:
    if value is not None:
        When(value)  # compiled and type-checked now; the mapping keeps its own compiled copy
    return value


class TypeRule(BaseModel):
    """`[[types.rules]]`: a legacy type matched whole by `match` becomes `to` (\\1.. its groups;
    a list: the EnclosedMessageTypes chain)."""

    model_config = ConfigDict(extra="forbid")
    match: str
    to: str | list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _compiles(self) -> TypeRule:
        try:
            pattern = re.compile(self.match)
        except re.error as e:
            raise ValueError(f"match {self.match!r} is not a regular expression: {e}") from None
        for target in [self.to] if isinstance(self.to, str) else self.to:
            for m in _GROUP_REF.finditer(target):
                n = int(m.group(1) or m.group(2))
                if n > pattern.groups:
                    raise ValueError(f"to {target!r} names group \\{n}, and match {self.match!r} has {pattern.groups} group(s)")
        return self

    def apply(self, legacy_type: str) -> list[str] | None:
        m = self.__dict__.get("_re") or self.__dict__.setdefault("_re", re.compile(self.match))
        hit = m.fullmatch(legacy_type)
        if hit is None:
            return None
        return [hit.expand(t) for t in ([self.to] if isinstance(self.to, str) else self.to)]


class RouteRule(BaseModel):
    """`[[routes.rules]]`: messages for which `when` holds go to `to`; tried before [routes]."""

    model_config = ConfigDict(extra="forbid")
    when: str | None = None
    to: str

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return _when(value)

    @field_validator("to")
    @classmethod
    def _name(cls, value: str) -> str:
        check_name(value, "route rule target")
        return value


class SkipRule(BaseModel):
    """`[[skip]]`: messages for which `when` holds are skipped, counted under the rule's name."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    when: str | None = None

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return _when(value)


# The rules that matched the message being mapped, where someone asks (preview, `qbridge map`):
# None elsewhere, so that a batch pays nothing for it.
MATCHED: ContextVar[list[str] | None] = ContextVar("qbridge_rules_matched", default=None)


def matched(label: str) -> None:
    """Notes that rule `label` ("skip[0] 'test traffic'", "body[1]") applied to the message being mapped."""
    seen = MATCHED.get()
    if seen is not None:
        seen.append(label)


def compiled(rule: Any) -> When | None:
    """The rule's `when`, compiled once per rule."""
    if rule.when is None:
        return None
    found: When | None = rule.__dict__.get("_compiled")
    if found is None:
        found = rule.__dict__.setdefault("_compiled", When(rule.when))
    return found


def _when_checked(value: str | None) -> str | None:
    return _when(value)


_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?$")


def parse_timespan(text: str) -> timedelta:
    """.NET TimeSpan text ("00:10:00", "1.02:00:00"), as NServiceBus.TimeToBeReceived is written."""
    m = _TIMESPAN.match(text)
    if m is None or int(m.group(3)) > 59 or int(m.group(4)) > 59:
        raise ValueError(f"{text!r} is no TimeSpan: write [d.]hh:mm:ss[.fffffff] (\"00:10:00\"), \"keep\" or \"none\"")
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups()[:4])
    fraction = int((m.group(5) or "0").ljust(7, "0")) / 10_000_000
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds + fraction)


def _path(value: str, what: str) -> str:
    if not value or any(not part for part in value.split(".")):
        raise ValueError(f"{what} {value!r} is no field path (names joined by '.', as \"Order.Lines\")")
    return value


class BodyRule(BaseModel):
    """`[[body]]`: JSON bodies of the messages `when` holds for, reshaped in this order: unwrap,
    strip_types, rename, delete, set."""

    model_config = ConfigDict(extra="forbid")
    when: str | None = None
    xml: Literal["keep", "json"] | None = None  # an XML body (BizTalk): as it is, or as JSON (bridge.codecs.xmljson)
    unwrap: str | None = None
    strip_types: bool = False
    rename: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)
    set: dict[str, Any] = Field(default_factory=dict)

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return _when_checked(value)

    @model_validator(mode="after")
    def _paths(self) -> BodyRule:
        if self.unwrap is not None:
            _path(self.unwrap, "unwrap")
        for old, new in self.rename.items():
            _path(old, "rename")
            if not new or "." in new:
                raise ValueError(f"rename {old!r} = {new!r}: the new name is a name at the same level, without '.'")
        for p in [*self.delete, *self.set]:
            _path(p, "path")
        if not (self.xml or self.unwrap or self.strip_types or self.rename or self.delete or self.set):
            raise ValueError("a [[body]] rule does nothing: give xml, unwrap, strip_types, rename, delete or set")
        if self.xml == "keep" and (self.unwrap or self.strip_types or self.rename or self.delete or self.set):
            raise ValueError('xml = "keep" sends the XML as it is: the JSON operations of this rule cannot apply')
        return self


class HeaderRule(BaseModel):
    """`[[headers.rules]]`: after [headers.rename/drop/set], in file order, for the messages
    `when` holds for: rename, drop, set (templates as [headers.set]), from_body (a body field's
    scalar value), replace (a regex and its replacement over a header's value)."""

    model_config = ConfigDict(extra="forbid")
    when: str | None = None
    rename: dict[str, str] = Field(default_factory=dict)
    drop: list[str] = Field(default_factory=list)
    set: dict[str, str] = Field(default_factory=dict)
    from_body: dict[str, str] = Field(default_factory=dict)
    replace: dict[str, tuple[str, str]] = Field(default_factory=dict)

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return _when_checked(value)

    @model_validator(mode="after")
    def _checked(self) -> HeaderRule:
        # `set`'s templates are checked by the Mapping, which knows the placeholders
        for header, path in self.from_body.items():
            _path(path, f"from_body {header!r}:")
        for header, (pattern, replacement) in self.replace.items():
            try:
                compiled_re = re.compile(pattern)
            except re.error as e:
                raise ValueError(f"replace {header!r}: {pattern!r} is not a regular expression: {e}") from None
            for m in _GROUP_REF.finditer(replacement):
                if int(m.group(1) or m.group(2)) > compiled_re.groups:
                    raise ValueError(f"replace {header!r}: {replacement!r} names a group {pattern!r} lacks")
        if not (self.rename or self.drop or self.set or self.from_body or self.replace):
            raise ValueError("a [[headers.rules]] rule does nothing: give rename, drop, set, from_body or replace")
        return self


class TtbrRule(BaseModel):
    """`[[ttbr]]`: NServiceBus.TimeToBeReceived (and the Expires column) of the messages `when`
    holds for, counted from their delivery; "keep" (the legacy expiry, as without rules) or
    "none" (no expiry). The first that holds wins."""

    model_config = ConfigDict(extra="forbid")
    when: str | None = None
    set: str

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return _when_checked(value)

    @field_validator("set")
    @classmethod
    def _span(cls, value: str) -> str:
        if value not in ("keep", "none"):
            parse_timespan(value)
        return value


class TransformRule(BaseModel):
    """`[[transforms]]`: a plugin, `module:function` or an entry point of group qbridge.transforms;
    only where the job's config table says `plugins = true`. Runs last."""

    model_config = ConfigDict(extra="forbid")
    use: str = Field(min_length=1)
    when: str | None = None

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return _when_checked(value)


# -- plugins: `module:function`, or the name of an entry point of group `qbridge.transforms`; loaded
# when the config loads, so that a name that does not resolve is a located error before anything
# runs, and only for a job whose config table says `plugins = true`, since a plugin is code
GROUP = "qbridge.transforms"
_LOADED: dict[str, Callable[[dict[str, Any]], Any]] = {}


def load(use: str) -> Callable[[dict[str, Any]], Any]:
    """The function `use` names; ValueError saying why when it does not resolve."""
    found = _LOADED.get(use)
    if found is not None:
        return found
    if ":" in use:
        module, _, name = use.partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except ImportError as e:
            raise ValueError(f"use {use!r}: module {module!r} cannot be imported ({e})") from None
        except AttributeError:
            raise ValueError(f"use {use!r}: module {module!r} has no {name!r}") from None
    else:
        points = [ep for ep in entry_points(group=GROUP) if ep.name == use]
        if not points:
            raise ValueError(f"use {use!r}: no entry point of that name in group {GROUP!r} (or write module:function)")
        fn = points[0].load()
    if not callable(fn):
        raise ValueError(f"use {use!r} is not a function")  # noqa: TRY004 - a located config error, as the others
    _LOADED[use] = fn
    return fn


def check_plugins(mapping: Any, allowed: bool, job_where: str, mapping_path: str) -> None:
    """Every plugin of the mapping resolves, and the job allows plugins: else a located error."""
    if not allowed:
        said = (f"[[transforms]] runs code, and {job_where} does not say `plugins = true` in the config (add it to the "
                "job's table to allow them)")
        raise ConfigError(mapping_path, [said])
    problems = []
    for i, rule in enumerate(mapping.transforms):
        try:
            load(rule.use)
        except ValueError as e:
            problems.append(f"transforms[{i}].use: {e}")
    if problems:
        raise ConfigError(mapping_path, problems)
