"""The lazy analysis runs unchanged on a dask.distributed cluster: two worker processes, the same numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workbench.analysis import compare
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run

distributed = pytest.importorskip("dask.distributed")


def test_the_largest_relative_differences_computed_on_a_two_worker_cluster_equal_the_local_ones(
        tmp_path: Path) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=200, sites=600, seed=3)
    b = write_synthetic_run(tmp_path / "b", steps=200, sites=600, seed=3, diverge_at=(70, 11))
    local = compare(open_run(a).records(), open_run(b).records()).relative_difference.max("step").compute()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        result = compare(open_run(a).records(), open_run(b).records())
        with distributed.get_task_stream(client) as tasks:
            remote = result.relative_difference.max("step").compute()  # the default scheduler is now the cluster
        workers = {task["worker"] for task in tasks.data}
        assert workers and workers <= set(client.scheduler_info()["workers"])
    assert remote.shape == (600, 12) and float(remote.max()) > 0
    np.testing.assert_array_equal(remote.to_numpy(), local.to_numpy())  # bitwise: the same reductions, elsewhere
