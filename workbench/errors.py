"""The workbench's errors: one root, each class also a matching built-in.

Callers can catch ``WorkbenchError`` for anything the workbench raises on purpose, or the
built-in (``FileNotFoundError``, ``ValueError``, ``RuntimeError``) as they would anywhere.
Every message says what happened and what to do about it.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Root of every error the workbench raises on purpose."""


class ConfigError(WorkbenchError, ValueError):
    """A configuration value is missing, of the wrong type, or outside its allowed values."""


class ArgumentError(WorkbenchError, ValueError):
    """An argument to a function or a verb is outside its allowed values (not a config field)."""


class RunNotFoundError(WorkbenchError, FileNotFoundError):
    """A path that should hold a run store does not exist."""


class NotARunError(WorkbenchError, ValueError):
    """A path exists but is not a workbench run store."""


class DamagedStoreError(NotARunError):
    """A run store is still being created, or part of it is missing or unreadable."""


class ForeignRunError(WorkbenchError, LookupError):
    """A run made by another producer (a user's loop, an importer) lacks what was asked of it:
    a workbench run config, checkpoints to replay from."""


class SchemaVersionError(WorkbenchError, ValueError):
    """A run store was written by a newer workbench than this one."""


class UnsupportedError(WorkbenchError, RuntimeError):
    """The requested feature needs hardware or software this machine does not have."""


class LaunchError(WorkbenchError, RuntimeError):
    """A training run could not be started, or one of its ranks failed."""


class CheckpointError(WorkbenchError, RuntimeError):
    """No usable checkpoint exists where one is needed, or it does not match the run."""


class CheckpointWriteError(CheckpointError, OSError):
    """Writing a checkpoint failed (a full disk, an I/O error, a permission): the partial checkpoint was
    removed and the run ends ``failed``."""


class NoSitesError(WorkbenchError, LookupError):
    """A run has no per-site records (recording was off, or it stopped before the first flush)."""


class NotRecordedYetError(NoSitesError):
    """A run that is starting or running has not written its first recorded step yet: not bad input; the
    command line says so and exits ``NOT_YET`` (75, sysexits' EX_TEMPFAIL: try again later)."""


NOT_YET = 75
"""The command line's exit status for a run that has not recorded yet."""


class DiskFullError(WorkbenchError, OSError):
    """A write found no room (a full disk, a quota, a read-only filesystem); what it had begun was removed, or
    the message says what stays (``workbench.disk``)."""

    def __str__(self) -> str:  # the sentence alone, not OSError's "[Errno 28] ..."
        return str(self.strerror)


class ExportError(WorkbenchError, RuntimeError):
    """A figure could not be exported: no browser for static images, or the browser failed to render it."""


class UntrustedFileError(WorkbenchError, ValueError):
    """A file would run code or is not what it claims; refused."""


class ImportFormatError(WorkbenchError, ValueError):
    """A file given to an importer holds no statistics in the format it reads."""


class LogNotFoundError(WorkbenchError, FileNotFoundError):
    """A log file or folder given to an importer does not exist."""


class EmptyTraceError(WorkbenchError, ValueError):
    """A trace without operations."""


class IncomparableRunsError(WorkbenchError, ValueError):
    """Two runs share no steps or sites, or train different model shapes."""


class GoldenFileError(WorkbenchError, ValueError):
    """A golden-values file that is neither Megatron-LM's format nor the workbench's."""


class RunDiverged(WorkbenchError, RuntimeError):  # noqa: N818 - what happened, as users catch it
    """A run left its live reference (``record(..., against=REF)``): raised by ``run.step`` on every rank at
    the same step. ``departure`` says where (``analysis.live.Departure``: step, site, detail, reference)."""

    def __init__(self, message: str, departure: object) -> None:
        super().__init__(message)
        self.departure = departure
