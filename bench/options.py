"""The benchmark's sizes and switches: the default run, `--quick`, and a flag per size."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from bench.protocol import SERVERS

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"


@dataclass(frozen=True)
class Sizes:
    """How much each scenario does (streams × deltas; intervals in ms)."""

    warmup_streams: int = 20
    warmup_deltas: int = 50
    idle_streams: int = 1000  # RSS per open stream
    ttfe_calls: int = 200  # sequential calls, time to first event
    ttft_ms: float = 20.0  # then as many with a provider whose first token takes this long
    latency_streams: int = 20  # light paced load: per-delta latency
    latency_deltas: int = 100
    latency_interval_ms: float = 20.0
    bulk_streams: int = 20  # unpaced: CPU per delta with many deltas per read
    bulk_deltas: int = 1000
    # Capacity: paced steps of `ramp_streams`, + `ramp_step`, ... streams (at load_interval_ms),
    # `ramp_deltas` deltas each, up to the first step a server does not sustain.
    ramp_streams: int = 100  # 5,000 deltas/s
    ramp_step: int = 50  # + 2,500 deltas/s a step
    ramp_max_streams: int = 300  # 15,000 deltas/s
    ramp_deltas: int = 100  # 2 s a step
    # Paced load: one step below the highest step both the gateway and the aiohttp relay
    # sustained (a margin: it runs longer), at most `load_streams` streams (50 deltas/s each).
    load_streams: int = 200
    load_deltas: int = 500
    load_interval_ms: float = 20.0
    stagger_ms: float = 1000.0  # paced streams (ramp, load) start spread over this long
    batch: int = 250  # calls opened per burst (at most 500)
    channels: int = 4  # client connections per server
    rounds: int = 4  # runs of ttfe, latency, bulk, load on each gateway variant, order rotating


QUICK = Sizes(
    warmup_streams=2,
    warmup_deltas=5,
    idle_streams=100,
    ttfe_calls=10,
    latency_streams=4,
    latency_deltas=10,
    latency_interval_ms=5.0,
    bulk_streams=4,
    bulk_deltas=50,
    ramp_streams=10,
    ramp_step=10,
    ramp_max_streams=20,
    ramp_deltas=5,
    load_streams=20,
    load_deltas=5,
    load_interval_ms=20.0,
    stagger_ms=40.0,
    batch=50,
    channels=2,
    rounds=2,
)


@dataclass(frozen=True)
class Options:
    sizes: Sizes = field(default_factory=Sizes)
    servers: tuple[str, ...] = SERVERS
    out: Path | None = DEFAULT_OUT
    profile_dir: Path | None = None  # run the servers under cProfile, stats written here
    quick: bool = False


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Baselines and the gateway, measured in one run on this machine.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help=f"comma-separated servers to measure (default: {','.join(SERVERS)})",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results file ('' = none)")
    parser.add_argument("--profile", default="", help="directory for cProfile stats of servers")
    for f in dataclasses.fields(Sizes):
        flag = "--" + f.name.replace("_", "-")
        kind = float if f.name.endswith("_ms") else int
        parser.add_argument(flag, type=kind, default=None, help=f"(default {f.default})")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else Sizes()
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(Sizes)
        if getattr(args, f.name) is not None
    }
    servers = tuple(s.strip() for s in args.servers.split(",") if s.strip())
    unknown = set(servers) - set(SERVERS)
    if unknown or not servers:
        parser.error(f"--servers: choose among {', '.join(SERVERS)}")
    return Options(
        sizes=dataclasses.replace(base, **overrides),
        servers=servers,
        out=Path(args.out) if args.out else None,
        profile_dir=Path(args.profile) if args.profile else None,
        quick=args.quick,
    )
