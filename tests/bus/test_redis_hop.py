"""The Redis hop benchmark at a tiny size: it runs, its followers agree, every figure is there.

Not a timing test (the machine is shared); `python -m bench.redis_hop` gives the figures.
"""

from __future__ import annotations

import math

from bench import redis_hop


async def test_the_redis_hop_is_measured(redis_url: str) -> None:
    figures = await redis_hop.measure(redis_url, deltas=30, interval_s=0.005, streams=3)
    print("\n" + redis_hop.markdown(figures))
    assert (figures["streams"], figures["deltas"], figures["interval_ms"]) == (3, 30, 5.0)
    for key in (
        "added_p50_us",
        "added_p90_us",
        "added_p99_us",
        "round_trip_p50_us",
        "local_cpu_us_per_event",
        "redis_cpu_us_per_event",
        "redis_server_cpu_us_per_event",
        "added_over_round_trip",
    ):
        assert math.isfinite(figures[key]) and figures[key] > 0, key
    assert figures["added_p50_us"] <= figures["added_p90_us"] <= figures["added_p99_us"]
    # One append script call per loop tick at most: never more than one per event.
    assert 0 < figures["append_calls_per_event"] <= 1
    text = redis_hop.markdown(figures)
    assert "| added latency, remote vs local follower, p50 |" in text
    assert "× a PING round trip" in text and ("(met)" in text or "(NOT met)" in text)
