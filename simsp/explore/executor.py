"""Where configurations run: an embedded Dask LocalCluster (one worker process per core, one
thread each), an existing Dask scheduler by address, or this process (workers=0).

Workers are long-lived processes: each imports simsp once and then evaluates configuration after
configuration. Results come back in completion order; callers sort them by configuration order.
"""

import logging
import os
from contextlib import contextmanager

from simsp.errors import UserError
from simsp.explore.evaluate import evaluate


# The scheduler's HTTP endpoint (and the dashboard, when bokeh is installed) on a free loopback
# port: `dashboard_address=None` still binds port 8787, which another sweep may hold.
LOOPBACK_ANY_PORT = "127.0.0.1:0"


def default_workers() -> int:
    """One worker per core."""
    return os.cpu_count() or 1


@contextmanager
def dask_client(workers: int | None, scheduler: str | None):
    """A distributed.Client on the given scheduler, or on an embedded loopback LocalCluster."""
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise UserError("--scheduler", f"cannot reach {scheduler}: {exc}") from None
        with client:
            yield client
        return
    with LocalCluster(n_workers=workers or default_workers(), threads_per_worker=1,
                      processes=True, dashboard_address=LOOPBACK_ANY_PORT, host="127.0.0.1",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        yield client


class Executor:
    """Evaluate batches of configurations; one Dask client kept for all batches (or none)."""

    def __init__(self, workers: int | None = None, scheduler: str | None = None):
        self.workers, self.scheduler = workers, scheduler
        self._context = None
        self.client = None

    def __enter__(self):

        """Start (or connect to) the Dask cluster unless in-process."""
        if self.scheduler or self.workers != 0:
            self._context = dask_client(self.workers, self.scheduler)
            self.client = self._context.__enter__()
        return self

    def __exit__(self, *exc):

        """Close the client and, if embedded, the cluster."""
        if self._context is not None:
            return self._context.__exit__(*exc)
        return False

    def parallelism(self) -> int:
        """How many configurations run at once: the cluster's worker threads (1 in-process)."""
        if self.client is None:
            return 1
        return max(1, sum(w["nthreads"] for w in self.client.scheduler_info()["workers"].values()))

    def results(self, jobs: dict):
        """Yield (digest, row) for each {digest: values} job as it completes."""
        if self.client is None:
            for digest, values in jobs.items():
                yield digest, evaluate(values)
            return
        from distributed import as_completed

        futures = {self.client.submit(evaluate, values, key=f"simsp-{digest}", pure=False): digest
                   for digest, values in jobs.items()}
        for future in as_completed(futures):
            yield futures[future], future.result()
            future.release()
