"""The one error tree of qbridge; each class says whether trying again can help."""

from __future__ import annotations


class BridgeError(Exception):
    """Root of every error qbridge raises on purpose."""

    retryable = False
    exit_code = 1


class ConfigError(BridgeError):
    """A config or mapping file is wrong; carries every problem found, each located."""

    exit_code = 2

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}: {p}" for p in problems))


class UsageError(BridgeError):
    """The command line asks for something that cannot be done."""

    exit_code = 2


class DriverMissing(BridgeError):
    """A database driver or the system library under it is not installed: says what to install."""

    exit_code = 2


class SetupError(BridgeError):
    """A database, login, schema or table the config names is not there or not allowed: waiting
    cannot fix it, so it is not retried (exit 2, as a config error)."""

    exit_code = 2


class SourceSchemaError(SetupError):
    """The legacy database does not have the tables or columns this source reads."""


class TargetSchemaError(SetupError):
    """The target database lacks a table qbridge writes to (run `qbridge init`)."""


class RetryableError(BridgeError):
    """A database is down, a deadlock or lock timeout: the same work can succeed later."""

    retryable = True


class BadRow(BridgeError):
    """One legacy row cannot become a message; it is quarantined with this reason."""


class UnreadableBlob(BridgeError):
    """A blob given to `qbridge inspect` cannot be decoded."""


class MigrationFailed(BridgeError):
    """A Spark task kept failing; what committed stays in the ledger and a re-run continues."""


class JobBusy(BridgeError):
    """Another qbridge process (a `qbridge run`, most often) holds the job's lock."""


class LockLost(BridgeError):
    """This process no longer holds a job's lock (its session ended, and another may have taken
    the job): it commits nothing more for that job (bridge.ledger.fence). Not retryable as it is: the
    job's lock must be taken again first."""
