"""`python -m bench.sse` keeps working: a tiny run of both of its parts."""

from __future__ import annotations

import orjson

from bench import sse


async def test_a_small_run_measures_both_paths() -> None:
    options = sse.Options(
        burst_events=200, streams=2, paced_events=20, pace_ms=1.0, repeats=1, codec_rounds=200
    )
    results = await sse.run(options)
    assert set(results["codec"]) == set(sse.ENCODERS)
    transport = results["transport"]
    for key in ("throughput_1_streams", "throughput_2_streams"):
        assert transport[key]["grpc_events_per_s"] > 0 and transport[key]["sse_events_per_s"] > 0
        assert transport[key]["sse_server_cpu_us_per_event"] > 0
    assert transport["latency"]["sse"]["p50_ms"] > 0
    report = sse.markdown(results)
    assert "codec.to_json (orjson) — used" in report and "events/s, 2 stream(s)" in report


def test_the_fast_encoder_writes_the_reference_json() -> None:
    for event in sse.sample_events():
        flat = orjson.loads(sse.ENCODERS["codec.to_json (orjson) — used"](event))
        assert orjson.loads(sse.ENCODERS["json_format.MessageToDict + orjson"](event)) == flat
