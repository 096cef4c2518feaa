"""The routing benchmark at a tiny size: its figures are there and its counts hold.

Not a timing test (the machine is shared); `python -m bench.routing` gives the figures.
"""

from __future__ import annotations

import math

from bench import routing


async def test_routing_cost_and_a_failed_first_deployment_are_measured() -> None:
    figures = await routing.run(
        routing.parse(["--calls", "200", "--rounds", "1", "--failover-calls", "3"])
    )
    print("\n" + routing.markdown(figures))
    assert set(figures["routing"]["us_per_call"]) == set(routing.STRATEGIES)
    assert all(math.isfinite(v) for v in figures["routing"]["us_per_call"].values())
    failover = figures["failover"]
    assert failover["requests_per_failed_over_call"] == 2  # one extra round trip, no retries
    assert failover["requests_to_it_while_cooling"] == 0
    assert failover["failed_request_ms_p50"] > 0
    assert "| routing CPU per call, ordered | ≤ 20 µs |" in routing.markdown(figures)
