"""The lines a rank prints for its launcher to find in its log: the prefixes the worker writes and the launcher
reads, apart from both (the worker imports torch, the launcher must not)."""

RANK_ERROR = "workbench: error: "
"""How a rank's log starts the line of an error the workbench raised on purpose (the worker prints it)."""
DIVERGED = "DIVERGED "
"""How rank 0's log starts the line that says where a run left its live reference (``--against``)."""
