"""Metrics every process shares: its dependencies (up, errors) and its own CPU and memory.

Every HELP ends with its unit, `(unit: ...)` (docs/operations.md lists them all). With `serve
--workers N` each process writes its values to files that /metrics adds up
(services/runtime/host/health.py): CPU seconds are a counter, so a worker that died keeps its
share of the total; memory is a live sum, and the supervisor forgets a dead worker's
(services/runtime/host/workers.py). prometheus_client's own `process_*` metrics describe only the
process that answered the scrape, hence these.
"""

import os
import resource

from prometheus_client import Counter, Gauge

# The dependencies a process may need; the values of the `dependency` label.
DEPENDENCIES = ("kafka", "postgres", "clickhouse", "redis")

DEPENDENCY_ERRORS = Counter(
    "tollgate_dependency_errors_total",
    "Requests or operations that failed because a dependency did not answer, by dependency (unit: errors)",
    ["dependency"],
)
DEPENDENCY_UP = Gauge(
    "tollgate_dependency_up",
    "Whether the last readiness probe of a dependency this process uses succeeded, by dependency (unit: 1 up, 0 down)",
    ["dependency"],
    multiprocess_mode="mostrecent",  # one process probes (serve's consumers' process)
)
PROCESS_CPU = Counter(
    "tollgate_process_cpu_seconds",
    "CPU time (user + system) of every Tollgate process of this serve, added up (unit: seconds)",
)
PROCESS_MEMORY = Gauge(
    "tollgate_process_resident_memory_bytes",
    "Resident memory of every live Tollgate process of this serve, added up (unit: bytes)",
    multiprocess_mode="livesum",
)
for _dependency in DEPENDENCIES:  # on /metrics at 0 from the start
    DEPENDENCY_ERRORS.labels(_dependency)

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class ProcessStats:
    """Adds this process's CPU used since the last call to `PROCESS_CPU` and sets its memory."""

    def __init__(self) -> None:
        self._cpu = 0.0

    def refresh(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        PROCESS_CPU.inc(max(0.0, cpu - self._cpu))
        self._cpu = cpu
        PROCESS_MEMORY.set(_resident_bytes())

    async def refresh_async(self) -> None:
        self.refresh()


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE
    except OSError:  # not Linux: the peak instead
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
