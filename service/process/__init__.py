"""Process control: the event loop a process runs on, its garbage collector, and workers.

- `eventloop`: the loop `AGW_EVENT_LOOP` names (uvloop's where available);
- `gctune`: the collector's thresholds, raised once the service is up;
- `supervisor`: N worker processes on the same ports, started, watched and restarted;
- `workers`: `AGW_WORKERS=N`, the service (or the HTTP adapter) as such workers.
"""
