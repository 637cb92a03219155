"""Importers: per-site statistics logged by other tools, read into the workbench.

    from workbench.importers import import_te_log, read_te_log, read_tensorboard, records_from_table

    run_dir = import_te_log(["logs/nvdlfw_inspect_statistics_logs"], "runs/te-a")   # a real run store
    records = records_from_table(read_tensorboard("tb/a"), "a")                    # RunRecords in memory

Each format is read into one long table (step, site, stat, value; ``importers.table``), from
which ``records_from_table`` builds ``RunRecords`` and ``write_run_from_table`` a run store.
Logs hold no tensor fingerprints: the fingerprint is a hash of the logged statistics.
The ``write_*`` functions write a run's statistics in each format, for benchmarks and tests.
Imports no torch; ``tensorboard`` only inside the TensorBoard functions.
"""

from workbench.errors import ImportFormatError, LogNotFoundError
from workbench.importers.table import (
    long_table,
    records_from_table,
    statistic_fingerprints,
    write_run_from_table,
)
from workbench.importers.te_log import import_te_log, read_te_log, te_log_path, write_te_log
from workbench.importers.tensorboard import read_tensorboard, write_tensorboard

__all__ = ["ImportFormatError", "LogNotFoundError", "import_te_log", "long_table", "read_te_log",
           "read_tensorboard", "records_from_table", "statistic_fingerprints", "te_log_path", "write_run_from_table",
           "write_te_log", "write_tensorboard"]
