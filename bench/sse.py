"""`python -m bench.sse`: the HTTP/SSE adapter measured against the gRPC stream it relays.

Two parts, printed as Markdown (`--json` prints the figures as JSON instead):

1. **Event → JSON**, the adapter's per-event hot path, for a realistic mix of
   events: `json_format.MessageToDict` + `json.dumps` (the obvious way) and its
   variants, against the descriptor-driven encoder the adapter uses
   (`service.gateway.codec`, written by orjson). µs per event, one core.
2. **Through the adapter vs. gRPC, in the same run**: the service (with its
   in-process adapter) runs in a child process on loopback, fed by a fake
   provider; this process is the client. *Throughput*: a provider that streams
   as fast as it can, events/s on one stream and on several concurrent ones.
   The service process's CPU time per event is given too (that process includes
   the fake provider, so the adapter's cost is the difference between the two
   paths); it holds steady when other processes load the machine.
   *Latency*: a paced provider that stamps each delta with its send time; the
   client measures send → receive per event. Each figure for SSE is also given
   as a ratio to gRPC.

Both processes run on the event loop `AGW_EVENT_LOOP` names, as the service does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from google.protobuf import json_format

from service.core import events
from service.gateway import codec
from service.process import eventloop
from service.providers import loopback as lb
from service.testing import Harness, oneshot_agent, write_agent

AGENT = "bench"


@dataclass
class Options:
    burst_events: int = 5000  # content deltas per stream, throughput runs
    streams: int = 16  # concurrent streams, second throughput run
    paced_events: int = 300  # deltas per stream, latency run
    pace_ms: float = 2.0  # between paced deltas
    repeats: int = 3  # best of, for throughput
    codec_rounds: int = 20000  # encodings per method, JSON part


# 1. Event → JSON ------------------------------------------------------------------------


def sample_events() -> list[pb.Event]:
    """The mix of a typical run: mostly deltas, some tool and bookkeeping events."""

    def stamped(event: pb.Event, seq: int, kind: str) -> pb.Event:
        event.seq, event.type, event.timestamp = seq, kind, 1_732_200_000_000 + seq
        event.chat_id, event.run_id = "5f0c2d9e-7b1a-4c1e-9d55-3f2a8b6c1d00", "9f86d081884c7d65"
        return event

    run = "9f86d081884c7d65"
    mix = [
        stamped(events.content_delta(f"{run}_c_1", "word "), i, "content.delta") for i in range(8)
    ]
    mix.append(stamped(events.reasoning_delta(f"{run}_r_1", "Let me "), 9, "reasoning.delta"))
    mix.append(stamped(events.tool_args("call_abc123", '{"city": "Pa', 0), 10, "tool.args"))
    tool = events.tool_start(
        "t_0a1b2c3d", "confirm_dialog", "html", tool_params=events.to_struct({"width": 420})
    )
    mix.append(stamped(tool, 11, "tool.start"))
    result = events.tool_result("call_abc123", {"city": "Paris", "temp": 21.5, "tags": ["sun"]})
    mix.append(stamped(result, 12, "tool.result"))
    usage = pb.Usage(prompt_tokens=1200, completion_tokens=300, total_tokens=1500)
    mix.append(stamped(events.run_complete("stop", usage), 13, "run.complete"))
    return mix


def _flat(data: dict[str, Any], event: pb.Event) -> dict[str, Any]:
    payload = event.WhichOneof("payload") or ""
    data.update(data.pop(pb.Event.DESCRIPTOR.fields_by_name[payload].json_name, {}))
    return data


ENCODERS: dict[str, Callable[[pb.Event], bytes]] = {
    "json_format.MessageToDict + json.dumps": lambda e: json.dumps(
        _flat(json_format.MessageToDict(e, unquote_int64_if_possible=True), e),
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode(),
    "json_format.MessageToJson (nested, not flat)": lambda e: json_format.MessageToJson(
        e, indent=None
    ).encode(),
    "json_format.MessageToDict + orjson": lambda e: orjson.dumps(
        _flat(json_format.MessageToDict(e, unquote_int64_if_possible=True), e)
    ),
    "codec.to_dict + json.dumps": lambda e: json.dumps(
        codec.to_dict(e), ensure_ascii=False, separators=(",", ":")
    ).encode(),
    "codec.to_json (orjson) — used": codec.to_json,
}


def bench_codec(rounds: int) -> dict[str, dict[str, float]]:
    """µs per event for each encoder, on the mix and on content.delta alone (best of 3)."""
    mix = sample_events()
    delta = mix[0]
    out: dict[str, dict[str, float]] = {}
    for name, encode in ENCODERS.items():
        out[name] = {
            "mix_us": _best_us(
                lambda enc=encode: [enc(e) for e in mix], rounds // len(mix), len(mix)
            ),
            "delta_us": _best_us(lambda enc=encode: enc(delta), rounds, 1),
        }
    return out


def _best_us(work: Callable[[], object], loops: int, per_loop: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(loops):
            work()
        best = min(best, time.perf_counter() - started)
    return best / (loops * per_loop) * 1e6


# 2. The service in a child process ------------------------------------------------------


def _responder(body: dict[str, Any]) -> AsyncIterator[lb.ScriptItem]:
    """'burst N': N deltas at once; 'paced N MS': N deltas MS apart, each its send time (ns)."""
    words = str(body["messages"][-1]["content"]).split()

    async def script() -> AsyncIterator[lb.ScriptItem]:
        if words[0] == "burst":
            chunk = lb.content("token ")
            for _ in range(int(words[1])):
                yield chunk
        else:
            pause = lb.Pause(float(words[2]) / 1000)
            for _ in range(int(words[1])):
                yield pause
                yield lb.content(str(time.time_ns()))
        yield lb.finish("stop")
        yield lb.DONE

    return script()


def _serve(conn: Connection) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            agents = Path(tmp) / "agents"
            write_agent(agents, AGENT, oneshot_agent("You are a benchmark."))
            (Path(tmp) / "tools").mkdir()
            async with (
                lb.LoopbackProvider(_responder) as provider,
                Harness.start(
                    agents, provider, tools_dir=Path(tmp) / "tools", max_concurrent_runs=10_000
                ) as harness,
            ):
                assert harness.app.http is not None
                conn.send((harness.app.grpc.port, harness.app.http.port))
                while await asyncio.to_thread(conn.recv) == "cpu":
                    conn.send(time.process_time())

    eventloop.run(main(), os.environ.get("AGW_EVENT_LOOP", "auto"))


# 2. The clients -------------------------------------------------------------------------


async def grpc_stream(stub: Any, message: str) -> list[tuple[float, pb.Event]]:
    request = gw.QueryRequest(agent_key=AGENT, message=message)
    return [(time.time_ns(), event) async for event in stub.Query(request)]


async def sse_stream(
    http: aiohttp.ClientSession, message: str
) -> list[tuple[float, dict[str, Any]]]:
    received = []
    async with http.post("/api/query", json={"agentKey": AGENT, "message": message}) as response:
        async for line in response.content:
            if line.startswith(b"data: "):
                received.append((time.time_ns(), orjson.loads(line[6:])))
    return received


async def throughput(
    stream: Callable[[str], Any], events: int, streams: int, repeats: int, server_cpu: Any
) -> tuple[float, float]:
    """Best events/s over `repeats` runs of `streams` concurrent streams, and the least
    CPU time the service's process spent per event (µs), which the load of other
    processes on the machine does not inflate."""
    best, least_cpu = 0.0, float("inf")
    for _ in range(repeats):
        cpu = await server_cpu()
        started = time.perf_counter()
        results = await asyncio.gather(*(stream(f"burst {events}") for _ in range(streams)))
        elapsed = time.perf_counter() - started
        count = sum(len(r) for r in results)
        best = max(best, count / elapsed)
        least_cpu = min(least_cpu, (await server_cpu() - cpu) / count * 1e6)
    return best, least_cpu


def _delays_ms(
    received: list[tuple[float, Any]], delta_of: Callable[[Any], str | None]
) -> list[float]:
    delays = []
    for arrived, event in received:
        sent = delta_of(event)
        if sent and sent.isdigit():
            delays.append((arrived - int(sent)) / 1e6)
    return delays


def _summary(delays: list[float]) -> dict[str, float]:
    delays = sorted(delays)
    return {
        "p50_ms": statistics.median(delays),
        "p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
        "mean_ms": statistics.fmean(delays),
    }


async def bench_transports(options: Options) -> dict[str, Any]:
    parent, child = multiprocessing.get_context("spawn").Pipe()
    process = multiprocessing.get_context("spawn").Process(target=_serve, args=(child,))
    process.start()
    try:
        grpc_port, http_port = await asyncio.to_thread(parent.recv)
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
            aiohttp.ClientSession(
                f"http://127.0.0.1:{http_port}", connector=aiohttp.TCPConnector(limit=0)
            ) as http,
        ):
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)

            def over_grpc(message: str) -> Any:
                return grpc_stream(stub, message)

            def over_sse(message: str) -> Any:
                return sse_stream(http, message)

            async def server_cpu() -> float:
                parent.send("cpu")
                seconds: float = await asyncio.to_thread(parent.recv)
                return seconds

            await over_grpc("burst 100")  # warm both paths up
            await over_sse("burst 100")
            results: dict[str, Any] = {}
            for streams in (1, options.streams):
                per = max(options.burst_events // streams, 200)
                grpc_rate, grpc_cpu = await throughput(
                    over_grpc, per, streams, options.repeats, server_cpu
                )
                sse_rate, sse_cpu = await throughput(
                    over_sse, per, streams, options.repeats, server_cpu
                )
                results[f"throughput_{streams}_streams"] = {
                    "grpc_events_per_s": grpc_rate,
                    "sse_events_per_s": sse_rate,
                    "sse_to_grpc": sse_rate / grpc_rate,
                    "grpc_server_cpu_us_per_event": grpc_cpu,
                    "sse_server_cpu_us_per_event": sse_cpu,
                    "sse_to_grpc_cpu": sse_cpu / grpc_cpu,
                }
            paced = f"paced {options.paced_events} {options.pace_ms}"
            grpc_delays = _delays_ms(
                await over_grpc(paced),
                lambda e: e.content_delta.delta if e.type == "content.delta" else None,
            )
            sse_delays = _delays_ms(
                await over_sse(paced),
                lambda e: e.get("delta") if e.get("type") == "content.delta" else None,
            )
            over_g, over_s = _summary(grpc_delays), _summary(sse_delays)
            results["latency"] = {
                "grpc": over_g,
                "sse": over_s,
                "added_p50_ms": over_s["p50_ms"] - over_g["p50_ms"],
                "sse_to_grpc_p50": over_s["p50_ms"] / over_g["p50_ms"],
                "sse_to_grpc_p99": over_s["p99_ms"] / over_g["p99_ms"],
            }
            return results
    finally:
        parent.send("stop")
        await asyncio.to_thread(process.join, 30)


# Report ---------------------------------------------------------------------------------


async def run(options: Options) -> dict[str, Any]:
    """Both parts; the figures as a dict (see `markdown`)."""
    return {
        "options": asdict(options),
        "codec": bench_codec(options.codec_rounds),
        "transport": await bench_transports(options),
    }


def markdown(results: dict[str, Any]) -> str:
    lines = ["## HTTP/SSE adapter", "", "### Event → JSON (µs per event, one core)", ""]
    lines += ["| encoder | mix of a run | content.delta |", "|---|---:|---:|"]
    for name, figures in results["codec"].items():
        lines.append(f"| {name} | {figures['mix_us']:.2f} | {figures['delta_us']:.2f} |")
    transport = results["transport"]
    lines += ["", "### Through the adapter vs. gRPC (same run)", ""]
    lines += ["| measure | gRPC | SSE | SSE / gRPC |", "|---|---:|---:|---:|"]
    for key, figures in transport.items():
        if key.startswith("throughput_"):
            streams = key.split("_")[1]
            lines.append(
                f"| events/s, {streams} stream(s) | {figures['grpc_events_per_s']:,.0f} | "
                f"{figures['sse_events_per_s']:,.0f} | {figures['sse_to_grpc']:.2f} |"
            )
            lines.append(
                f"| service CPU µs/event, {streams} stream(s) | "
                f"{figures['grpc_server_cpu_us_per_event']:.1f} | "
                f"{figures['sse_server_cpu_us_per_event']:.1f} | {figures['sse_to_grpc_cpu']:.2f} |"
            )
    latency = transport["latency"]
    for stat in ("p50_ms", "p99_ms"):
        g, s = latency["grpc"][stat], latency["sse"][stat]
        lines.append(f"| delta latency {stat[:3]} (ms) | {g:.2f} | {s:.2f} | {s / g:.2f} |")
    lines += ["", f"Added latency through the adapter (p50): {latency['added_p50_ms']:.2f} ms."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sse", description=__doc__.split("\n")[0])
    defaults = Options()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    results = eventloop.run(run(Options(**args)), os.environ.get("AGW_EVENT_LOOP", "auto"))
    print(json.dumps(results, indent=2) if as_json else markdown(results))


if __name__ == "__main__":
    main()
