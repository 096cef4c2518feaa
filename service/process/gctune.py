"""The garbage collector of a service process: fewer collections, none of start-up's objects.

A run keeps the events of its log in memory while it runs and for
`run_retention_s` after it ended, so a busy process holds hundreds of thousands
of protobuf messages. With the interpreter's default thresholds (700, 10, 10)
the cyclic collector runs every few hundred allocations, and its full
collections walk every one of those messages: tens of milliseconds, a pause for
every stream, several percent of the CPU. `tune()`, called once the service is
up, moves what start-up allocated (modules, descriptors, settings) out of the
collector's sight (`gc.freeze`) and raises the thresholds. Reference counting
still frees everything else at once; cycles are still collected, less often.

That is why a run must not end in a reference cycle: an ended run lets go of what
refers back to it (its log's observers and hooks, its turn observers, its task and
the frames a cancellation kept: `EventLog._let_go`, `RunState.let_go`), so that it is
freed by reference counting when it is released, not at a rare full collection
(tests/core/run/test_release.py counts them; `python -m bench.soak` measures the
memory a run leaves behind).
"""

from __future__ import annotations

import gc

#: A young collection every 10,000 container allocations (net), an older one every 20 of
#: those, a full one at most every 100 older ones (and, as always, only once the objects
#: waiting for it are a quarter of those it would walk).
THRESHOLDS = (10_000, 20, 100)


def tune() -> None:
    """Freeze what exists now and raise the collector's thresholds (for the process)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
