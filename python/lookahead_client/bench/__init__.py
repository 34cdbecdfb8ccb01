"""The replay benchmark: recorded token streams served to drafters by a simulated engine.

``lookahead-bench replay`` (or ``python -m lookahead_client.bench replay``) runs it from the
command line; :func:`replay` runs one configuration from Python. See ``replay.py`` for the
exact order of events and ``docs/benchmarks-replay.md`` for figures.
"""

from .registry import DRAFTERS, DrafterOptions, get_spec
from .replay import ReplayResult, ReplaySettings, accepted_length, replay
from .workload import DEMO_WORKLOAD, Request, Workload, WorkloadError, load_workload

__all__ = [
    "DEMO_WORKLOAD",
    "DRAFTERS",
    "DrafterOptions",
    "ReplayResult",
    "ReplaySettings",
    "Request",
    "Workload",
    "WorkloadError",
    "accepted_length",
    "get_spec",
    "load_workload",
    "replay",
]
