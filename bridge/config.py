"""The config file: connections and jobs, with `${NAME}` expansion and masked secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy.engine import make_url

from bridge.errors import ConfigError
from bridge.identifiers import check_name
from bridge.mapping import Mapping, load_mapping
from bridge.settings_io import expand_env, read_toml, validate
from bridge.timefmt import parse_duration, parse_rate, zone

SYSTEMS = ("nginn", "openjms", "biztalk")
LEGACY_SYSTEMS = SYSTEMS
NSB = "nservicebus"


def _valid_zone(value: str | None) -> str | None:
    if value is not None:
        zone(value)
    return value


class SourceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    system: Literal["nginn", "openjms", "biztalk", "nservicebus"]
    connection: str
    queues: list[str] = Field(min_length=1)
    timezone: str | None = None
    database: str | None = None  # identity used in message ids; defaults to the URL's database
    schema_: str | None = Field(default=None, alias="schema")
    # nservicebus sources only: which transport's table shapes the proxy queues have.
    flavor: Literal["postgresql", "sqlserver"] | None = None
    catalog: str | None = None  # nservicebus sources on SQL Server: the catalog in addresses

    @property
    def schema_name(self) -> str:
        """The NServiceBus schema of an nservicebus source (the transports' defaults)."""
        return self.schema_ or ("public" if self.flavor == "postgresql" else "dbo")

    @field_validator("queues")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for q in value:
            check_name(q, "queue name")
        if len(set(value)) != len(value):
            raise ValueError("a queue is listed twice")
        return value

    _zone = field_validator("timezone")(classmethod(lambda cls, value: _valid_zone(value)))

    @field_validator("schema_")
    @classmethod
    def _schema(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, "schema")


class TargetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # A target without `system` is NServiceBus; a legacy system makes the job a reverse job.
    system: Literal["nservicebus", "nginn", "openjms", "biztalk"] = "nservicebus"
    connection: str
    flavor: Literal["postgresql", "sqlserver"] | None = None  # NServiceBus targets: required
    schema_: str | None = Field(default=None, alias="schema")
    error_queue: str = "error"
    audit_queue: str = "audit"
    # SQL Server transport addresses are `queue@[schema]@[catalog]`; defaults to the URL's database.
    catalog: str | None = None
    # Legacy targets: server-local time zone (NGinn), identity of the legacy database in echo
    # checks (default: the URL's database, as a forward job's source.database), and NGinn's
    # connection-string alias in endpoint URIs `sql://ALIAS/Queue` (default: that identity).
    timezone: str | None = None
    database: str | None = None
    alias: str | None = None
    table: str | None = None  # BizTalk targets: the staging table a WCF-SQL receive location polls

    @field_validator("schema_", "error_queue", "audit_queue", "catalog", "table")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value, "name")

    _zone = field_validator("timezone")(classmethod(lambda cls, value: _valid_zone(value)))

    @field_validator("alias")
    @classmethod
    def _alias(cls, value: str | None) -> str | None:
        if value is not None and (not value or "/" in value or "|" in value or "=" in value):
            raise ValueError("an NGinn connection alias is a plain name (no '/', '|' or '=')")
        return value

    @property
    def schema_name(self) -> str:
        return self.schema_ or ("public" if self.flavor == "postgresql" else "dbo")


class Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    every: str | None = None
    cron: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Schedule:
        if (self.every is None) == (self.cron is None):
            raise ValueError("give exactly one of 'every' (e.g. \"5s\") or 'cron' (e.g. \"*/5 * * * *\")")
        if self.every is not None and parse_duration(self.every) <= 0:
            raise ValueError(f"every = {self.every!r} must be longer than 0")
        if self.cron is not None:
            from apscheduler.triggers.cron import CronTrigger

            try:
                CronTrigger.from_crontab(self.cron)
            except ValueError as e:
                raise ValueError(f"cron = {self.cron!r} is not a crontab expression (minute hour day month weekday): {e}") from None
        return self


class JobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    source: SourceConfig
    target: TargetConfig
    mapping: str
    mode: Literal["copy", "move"] = "copy"
    schedule: Schedule | None = None
    # Rows per transaction. SQL Server caps a statement at 2100 parameters (a move-mode consume
    # lists the batch's keys), so 2000 there; PostgreSQL, MariaDB and SQLite take up to 20000.
    batch_size: int = Field(default=1000, ge=1, le=20_000)
    # How long an id gap may stay open before qbridge stops waiting for a late commit.
    late_commit_window: str = "15m"
    # How long a scan source's or a reverse job's ledger entry is kept once its source row is
    # gone (as the NServiceBus Outbox keeps its deduplication data); never shorter than the window.
    ledger_retention: str = "7d"
    # Steering (issue 38). At most this many messages a second ("200/s", "12000/m", "50/h"),
    # held across batches and schedules; `migrate` shares it out over its task slots.
    max_rate: str | None = None
    # The mapping's [[transforms]] run code (issue 47): only where the job says so.
    plugins: bool = False
    # Back-pressure: while a destination queue table holds more rows than this, the job holds its
    # messages, until the queue is below `resume_depth_percent` of it. A number for every queue
    # the job writes, or a table of queue -> number with "*" for the others.
    max_target_depth: int | dict[str, int] | None = None
    resume_depth_percent: int = Field(default=80, ge=1, le=100)
    # Each migrated message carries the W3C traceparent of the batch that wrote it (issue 39);
    # None: when tracing is on (an OTEL_* exporter configured). false keeps headers as they were.
    trace_messages: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "job name")

    @field_validator("max_rate")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rate(value)
        return value

    @field_validator("max_target_depth")
    @classmethod
    def _depth(cls, value: int | dict[str, int] | None) -> int | dict[str, int] | None:
        for n in ([value] if isinstance(value, int) else (value or {}).values()):
            if n < 1:
                raise ValueError(f"max_target_depth {n} must be at least 1 row")
        return value

    @property
    def rate_per_second(self) -> float | None:
        return parse_rate(self.max_rate) if self.max_rate else None

    def depth_limit(self, queue: str) -> int | None:
        """The most rows `queue` may hold before the job holds its messages (None: no limit)."""
        d = self.max_target_depth
        if d is None or isinstance(d, int):
            return d
        return d.get(queue, d.get("*"))

    @field_validator("late_commit_window", "ledger_retention")
    @classmethod
    def _window(cls, value: str) -> str:
        parse_duration(value)
        return value

    @model_validator(mode="after")
    def _retention_covers_the_window(self) -> JobConfig:
        if parse_duration(self.ledger_retention) < parse_duration(self.late_commit_window):
            raise ValueError(f"ledger_retention {self.ledger_retention!r} is shorter than late_commit_window "
                             f"{self.late_commit_window!r}: an entry must outlive the wait for a late commit")
        return self

    @model_validator(mode="after")
    def _reverse_moves(self) -> JobConfig:
        # Reading NServiceBus consumes (the transport has no other receive); an explicit
        # mode = "copy" is refused with its reason in ConfigFile.problems.
        if self.source.system == NSB and "mode" not in self.model_fields_set:
            self.mode = "move"
        return self

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.late_commit_window)

    @property
    def retention_seconds(self) -> float:
        return parse_duration(self.ledger_retention)

    @property
    def reverse(self) -> bool:
        """NServiceBus -> legacy: the job reads NServiceBus proxy queues."""
        return self.source.system == NSB


class ServiceConfig(BaseModel):
    """`[service]`: how `qbridge run` serves its metrics."""

    model_config = ConfigDict(extra="forbid")
    listen: str | None = None  # HOST:PORT for /metrics

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            from bridge.settings_io import parse_listen

            try:
                parse_listen(value)
            except Exception as e:  # noqa: BLE001 - parse_listen's own errors become a located config error
                raise ValueError(str(e).replace("--listen", "listen")) from None
        return value


class ConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    connections: dict[str, str]
    jobs: list[JobConfig] = Field(min_length=1)
    service: ServiceConfig | None = None

    def problems(self) -> list[str]:
        """Cross-references pydantic cannot check field by field."""
        problems = []
        names = [j.name for j in self.jobs]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"job name {dup!r} is used twice")
        for i, job in enumerate(self.jobs):
            for side, conn in (("source", job.source.connection), ("target", job.target.connection)):
                if conn not in self.connections:
                    problems.append(f"jobs[{i}].{side}.connection: {conn!r} is not in [connections] ({', '.join(self.connections) or 'none defined'})")
            if job.source.system == "nginn" and job.source.timezone is None:
                problems.append(f"jobs[{i}].source.timezone: required for nginn (NGinn stores server-local times); give the legacy server's IANA zone, e.g. \"Europe/Warsaw\"")
            problems.extend(_direction_problems(i, job))
            if job.batch_size > MSSQL_BATCH_MAX and (on_mssql := mssql_side(self.connections, job)):
                problems.append(f"jobs[{i}].batch_size: {job.batch_size} is more than SQL Server takes in one statement "
                                f"(the {on_mssql} is SQL Server); at most {MSSQL_BATCH_MAX}")
        for name, url in self.connections.items():
            try:
                make_url(url)
            except Exception:  # noqa: BLE001 - make_url raises several kinds; any of them means not a URL
                problems.append(f"connections.{name}: not a SQLAlchemy URL (expected e.g. postgresql+psycopg://host/db)")
        return problems


MSSQL_BATCH_MAX = 2000


def mssql_side(connections: dict[str, str], job: JobConfig) -> str | None:
    """"source" or "target" where that side of `job` is SQL Server (the source first), else None."""
    for side, conn in (("source", job.source.connection), ("target", job.target.connection)):
        if _backend(connections.get(conn, "")) == "mssql":
            return side
    return None


def _backend(url: str) -> str | None:
    try:
        return make_url(url).get_backend_name()
    except Exception:  # noqa: BLE001 - an unparseable URL is reported by check_urls
        return None


def _direction_problems(i: int, job: JobConfig) -> list[str]:
    """A job moves NServiceBus <-> legacy: exactly one side is NServiceBus, each side complete."""
    at = f"jobs[{i}]"
    src, tgt = job.source, job.target
    if src.system == NSB and tgt.system == NSB:
        return [f"{at}.target.system: a job reading NServiceBus writes a legacy system; give one of {', '.join(LEGACY_SYSTEMS)}"]
    if src.system != NSB and tgt.system != NSB:
        return [(f"{at}.target.system: {tgt.system!r} is a legacy system, and so is the source {src.system!r}; "
                 "one side of a job is NServiceBus (leave target.system out for NServiceBus)")]
    problems = []
    if src.system == NSB:
        if src.flavor is None:
            problems.append(f"{at}.source.flavor: required for an nservicebus source (\"postgresql\" or \"sqlserver\")")
        if job.mode != "move":
            problems.append(f"{at}.mode: a job reading NServiceBus always consumes what it reads, as the transport's own "
                            "receive does; set mode = \"move\" (copy would deliver every message again on every pass)")
        if tgt.system == "nginn" and tgt.timezone is None:
            problems.append(f"{at}.target.timezone: required for an nginn target (NGinn stores server-local times); "
                            "give the legacy server's IANA zone, e.g. \"Europe/Warsaw\"")
        if tgt.flavor is not None:
            problems.append(f"{at}.target.flavor: only NServiceBus targets have a flavor; the NServiceBus side of this job is the source")
    elif tgt.flavor is None:
        problems.append(f"{at}.target.flavor: required for an NServiceBus target (\"postgresql\" or \"sqlserver\")")
    return problems


class Config:
    """A loaded config: the validated file, its mappings, and where it lives."""

    def __init__(self, path: Path, data: ConfigFile, mappings: dict[str, Mapping]) -> None:
        self.path = path
        self.connections = data.connections
        self.jobs = data.jobs
        self.service = data.service
        self._mappings = mappings

    def mapping(self, job: JobConfig) -> Mapping:
        return self._mappings[job.name]

    def job(self, name: str) -> JobConfig:
        for job in self.jobs:
            if job.name == name:
                return job
        raise ConfigError(str(self.path), [f"no job named {name!r} (jobs: {', '.join(j.name for j in self.jobs)})"])

    def select(self, name: str | None) -> list[JobConfig]:
        return [self.job(name)] if name else list(self.jobs)


def mask_url(url: str) -> str:
    """The URL with its password replaced by ***, safe for logs and output."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - masking must never fail, whatever the URL
        return "<unparseable URL>"


def load_config(path: str | Path) -> Config:
    """Reads, expands and validates a config file and every mapping it names."""
    path = Path(path)
    raw = expand_env(read_toml(path), str(path))
    data = validate(ConfigFile, raw, str(path))
    if problems := data.problems():
        raise ConfigError(str(path), problems)
    mappings = {}
    for i, job in enumerate(data.jobs):
        mapping_path = resolve_relative(path, job.mapping)
        if mapping_path is None:
            raise ConfigError(str(path), [f"jobs[{i}].mapping: file {job.mapping!r} not found (looked beside the config file and in the current directory)"])
        mappings[job.name] = load_mapping(mapping_path)
        rules = mappings[job.name].rule_kinds()
        if job.reverse and rules:
            raise ConfigError(str(mapping_path), [f"{kind}: jobs[{i}] ({job.name!r}) is a reverse job, and these rules reshape "
                                                  "messages on their way to NServiceBus only; move them to a forward job's mapping"
                                                  for kind in rules])
        if mappings[job.name].transforms:
            from bridge.mapping_rules import check_plugins

            check_plugins(mappings[job.name], job.plugins, f"jobs[{i}]", str(mapping_path))
        limits = job.max_target_depth
        if isinstance(limits, dict) and not job.reverse:
            routed = set(mappings[job.name].target_queues())
            unknown = sorted(set(limits) - routed - {"*"})
            if unknown:  # a misspelt queue would leave the real one without its limit, silently
                raise ConfigError(str(path), [
                    (f"jobs[{i}].max_target_depth: {', '.join(map(repr, unknown))} is no queue the mapping routes to "
                     f"(its queues: {', '.join(sorted(routed)) or 'none'}; \"*\" means every other)")])
    return Config(path, data, mappings)


def resolve_relative(config_path: Path, name: str) -> Path | None:
    p = Path(name)
    if p.is_absolute():
        return p if p.exists() else None
    for candidate in (config_path.parent / p, Path.cwd() / p):
        if candidate.exists():
            return candidate
    return None
