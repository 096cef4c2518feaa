"""Model aliases through the whole service: fake providers on loopback that fail in each way.

Each deployment is a provider of its own on a loopback server of its own, so what each
was asked shows which deployment a call went to. Runs go through gRPC on loopback.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from agw.v1 import gateway_pb2 as gw

from service.assembly.config import AliasSettings, DeploymentSettings, ProviderSettings
from service.providers.loopback import (
    CLOSE,
    DONE,
    Gate,
    HttpError,
    LoopbackProvider,
    Pause,
    content,
    finish,
    usage,
)
from service.testing import Harness, oneshot_agent, write_agent

HEAD = ["request.query", "chat.start", "run.start"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]
STANDARD = gw.DEBUG_LEVEL_STANDARD


def answer(text: str = "ok") -> list[Any]:
    return [content(text), finish("stop"), DONE]


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, LoopbackProvider]]:
    found = {name: LoopbackProvider() for name in "abc"}
    for server in found.values():
        await server.start()
    try:
        yield found
    finally:
        for server in found.values():
            await server.stop()


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    write_agent(directory, "routed", oneshot_agent("Be brief.", modelConfig={"model": "smart"}))
    write_agent(directory, "other", oneshot_agent("Be brief.", modelConfig={"model": "other"}))
    return directory


def dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@asynccontextmanager
async def routed(
    agents: Path,
    servers: dict[str, LoopbackProvider],
    *,
    deployments: dict[str, dict[str, Any]] | None = None,
    urls: dict[str, str] | None = None,
    alias: dict[str, Any] | None = None,
    **overrides: Any,
) -> AsyncIterator[Harness]:
    """The service with provider `p<x>` on server `x`, deployment `x` on it, and the alias
    `smart` of deployments a, b, c (in that order unless `alias` says)."""
    urls = {name: server.url for name, server in servers.items()} | (urls or {})
    providers = {
        f"p{name}": ProviderSettings(base_url=url, max_retries=0, read_timeout_s=2)
        for name, url in urls.items()
    }
    settings = {name: {"provider": f"p{name}", "model": f"model-{name}"} for name in urls}
    for name, extra in (deployments or {}).items():
        settings[name] = {**settings[name], **extra}
    async with Harness.start(
        agents,
        None,
        providers=providers,
        deployments={n: DeploymentSettings(**d) for n, d in settings.items()},
        aliases={"smart": AliasSettings(**{"deployments": ["a", "b", "c"], **(alias or {})})},
        **{"default_provider": "pa", **overrides},
    ) as gateway:
        yield gateway


@asynccontextmanager
async def two_replicas(
    tmp_path: Path,
    agents: Path,
    servers: dict[str, LoopbackProvider],
    redis_url: str,
    deployments: dict[str, dict[str, Any]],
    **options: Any,
) -> AsyncIterator[tuple[Harness, Harness]]:
    """Two replicas of the service sharing a Redis (the Redis run bus, so the limits)."""
    shared = {"run_bus": "redis", "redis_url": redis_url, "deployments": deployments, **options}
    async with (
        routed(agents, servers, replica_id="r1", data_dir=tmp_path / "r1", **shared) as one,
        routed(agents, servers, replica_id="r2", data_dir=tmp_path / "r2", **shared) as two,
    ):
        yield one, two


def asked(servers: dict[str, LoopbackProvider]) -> dict[str, int]:
    return {name: len(server.requests) for name, server in servers.items()}


def kinds(found: list[Any]) -> list[str]:
    return [e.type for e in found]


def text_of(found: list[Any]) -> str:
    return "".join(e.content_delta.delta for e in found if e.type == "content.delta")


# -- fallback before the first delta -------------------------------------------------------


async def test_a_failing_deployment_moves_the_call_to_the_next_in_order(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue([HttpError(503, {"error": {"message": "overloaded"}})])
    servers["b"].enqueue(answer("from b"), answer("b again"))
    async with routed(agents, servers) as gateway:
        found = await gateway.query("routed", "hi")
        again = await gateway.query("routed", "hi")  # a is cooling down: b at once
    assert kinds(found) == [*HEAD, *ANSWER]  # nothing of the fallback shows
    assert text_of(found) == "from b" and text_of(again) == "b again"
    assert asked(servers) == {"a": 1, "b": 2, "c": 0}
    assert [r["model"] for r in servers["b"].requests] == ["model-b", "model-b"]


async def test_with_debug_each_attempt_is_a_model_start_and_end_naming_its_deployment(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue([HttpError(429, {"error": {"message": "slow down"}})])
    servers["b"].enqueue([content("ok"), finish("stop"), usage(5, 2), DONE])
    async with routed(agents, servers) as gateway:
        found = await gateway.query("routed", "hi", debug_level=STANDARD)
    assert kinds(found) == [
        *HEAD,
        "model.start",
        "model.end",
        "model.fallback",
        "model.start",
        "content.start",
        "content.delta",
        "content.end",
        "model.end",
        "usage.update",
        "run.complete",
    ]
    first, failed, fallback, second = (e for e in found[3:7])
    assert (first.model_start.deployment, first.model_start.attempt) == ("a", 1)
    assert (first.model_start.provider, first.model_start.model) == ("pa", "model-a")
    assert first.model_start.input  # the call's input, on its first attempt
    assert (failed.model_end.attempt, failed.model_end.finish_reason) == (1, "error")
    assert failed.model_end.error.reason == "PROVIDER_ERROR"
    assert failed.model_end.error.message == "provider 'pa': HTTP 429: slow down"
    fell = fallback.model_fallback
    assert (fell.deployment, fell.attempt, fell.next_deployment, fell.restarted) == (
        "a",
        1,
        "b",
        False,
    )
    assert fell.error.message == "provider 'pa': HTTP 429: slow down"
    assert (second.model_start.deployment, second.model_start.attempt) == ("b", 2)
    assert (second.model_start.model, second.model_start.input) == ("model-b", "")
    end = found[-3].model_end
    assert (end.attempt, end.finish_reason, end.HasField("error")) == (2, "stop", False)
    assert found[-2].usage_update.model == "model-b"  # what answered, not the alias


FAILURES = [
    pytest.param([HttpError(500, "boom")], id="500"),
    pytest.param([HttpError(502, "bad gateway")], id="502"),
    pytest.param([HttpError(429, {"error": {"message": "rate"}})], id="429"),
    pytest.param([HttpError(401, {"error": {"message": "Incorrect API key"}})], id="key-revoked"),
    pytest.param([HttpError(403, {"error": {"message": "forbidden"}})], id="403"),
    pytest.param(
        [
            HttpError(
                404, {"error": {"message": "The model does not exist", "code": "model_not_found"}}
            )
        ],
        id="model-not-found",
    ),
    pytest.param(
        [
            HttpError(
                400,
                {"error": {"message": "The model `x` does not exist or you do not have access"}},
            )
        ],
        id="model-refused",
    ),
    pytest.param([Pause(5.0), content("late")], id="time-out"),
    pytest.param([{"error": {"message": "overloaded", "code": 529}}], id="error-chunk-first"),
    pytest.param(
        [HttpError(200, "<html>login</html>", content_type="text/html")], id="not-a-stream"
    ),
]


@pytest.mark.parametrize("script", FAILURES)
async def test_each_way_a_deployment_fails_moves_the_call_on(
    agents: Path, servers: dict[str, LoopbackProvider], script: list[Any]
) -> None:
    servers["a"].enqueue(script)
    servers["b"].enqueue(answer("saved"))
    async with routed(agents, servers) as gateway:
        found = await gateway.query("routed", "hi")
    assert kinds(found) == [*HEAD, *ANSWER]
    assert text_of(found) == "saved"
    assert asked(servers) == {"a": 1, "b": 1, "c": 0}


async def test_an_unreachable_deployment_moves_the_call_on(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["b"].enqueue(answer("saved"))
    async with routed(agents, servers, urls={"a": dead_url()}) as gateway:
        found = await gateway.query("routed", "hi")
    assert text_of(found) == "saved"


async def test_a_bad_request_fails_at_once_on_every_deployment(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue([HttpError(400, {"error": {"message": "messages: bad role"}})])
    servers["b"].enqueue(answer("never"))
    async with routed(agents, servers) as gateway:
        found = await gateway.query("routed", "hi")
        status = await gateway.stub.ListModels(gw.ListModelsRequest())
    assert kinds(found) == [*HEAD, "run.error"]
    error = found[-1].run_error.error
    assert (error.reason, error.message) == (
        "PROVIDER_ERROR",
        "provider 'pa': HTTP 400: messages: bad role",
    )
    assert asked(servers) == {"a": 1, "b": 0, "c": 0}
    assert status.aliases[0].deployments[0].state == "healthy"  # not the deployment's fault


async def test_when_every_deployment_fails_the_run_ends_with_the_last_error(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    for server in servers.values():
        server.enqueue([HttpError(503, "down")])
    async with routed(agents, servers) as gateway:
        found = await gateway.query("routed", "hi")
        later = await gateway.query("routed", "hi")
    assert found[-1].run_error.error.message == "provider 'pc': HTTP 503: down"
    assert asked(servers) == {"a": 1, "b": 1, "c": 1}  # one round trip each, no retries
    message = later[-1].run_error.error.message
    assert message.startswith("provider 'smart': no deployment is available: a cooling down for ")
    assert "(provider 'pb': HTTP 503: down)" in message


# -- cool-down, probe, Retry-After ---------------------------------------------------------


async def test_a_cooled_down_deployment_is_probed_and_recovers(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue(
        [HttpError(503, "down")], [HttpError(503, "still down")], answer("a is back")
    )
    servers["b"].enqueue(*[answer("from b")] * 4)
    cool = {"a": {"cooldown_s": 0.3}}
    async with routed(agents, servers, deployments=cool) as gateway:
        await gateway.query("routed", "hi")  # a fails: cools down 0.3 s
        await gateway.query("routed", "hi")  # to b
        assert asked(servers) == {"a": 1, "b": 2, "c": 0}
        states = await gateway.stub.ListModels(gw.ListModelsRequest())
        a = states.aliases[0].deployments[0]
        assert (a.state, a.reason) == ("cooling_down", "provider 'pa': HTTP 503: down")
        assert a.retry_at_ms > time.time() * 1000
        await asyncio.sleep(0.35)
        probe = await gateway.query("routed", "hi")  # the probe fails: cools down 0.6 s
        assert text_of(probe) == "from b" and asked(servers) == {"a": 2, "b": 3, "c": 0}
        await asyncio.sleep(0.35)
        assert text_of(await gateway.query("routed", "hi")) == "from b"  # not yet again
        await asyncio.sleep(0.3)
        assert text_of(await gateway.query("routed", "hi")) == "a is back"
        states = await gateway.stub.ListModels(gw.ListModelsRequest())
    assert states.aliases[0].deployments[0].state == "healthy"
    assert (states.aliases[0].deployments[0].calls, states.aliases[0].deployments[0].failures) == (
        3,
        2,
    )


async def test_the_cool_down_honours_the_retry_after(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    limited = HttpError(429, {"error": {"message": "rate"}}, headers={"Retry-After": "1"})
    servers["a"].enqueue([limited], answer("a again"))
    servers["b"].enqueue(answer("b"), answer("b"))
    async with routed(agents, servers) as gateway:  # cooldown_s 30: Retry-After 1 s wins
        await gateway.query("routed", "hi")
        states = await gateway.stub.ListModels(gw.ListModelsRequest())
        retry_at = states.aliases[0].deployments[0].retry_at_ms / 1000
        assert 0.5 < retry_at - time.time() <= 1.05
        assert text_of(await gateway.query("routed", "hi")) == "b"
        await asyncio.sleep(max(0.0, retry_at - time.time()) + 0.05)
        assert text_of(await gateway.query("routed", "hi")) == "a again"


# -- after the first delta ------------------------------------------------------------------


async def test_no_switch_after_the_first_delta(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue([content("Hel"), CLOSE])
    servers["b"].enqueue(answer("never"))
    async with routed(agents, servers) as gateway:
        found = await gateway.query("routed", "hi")
        states = await gateway.stub.ListModels(gw.ListModelsRequest())
    assert kinds(found) == [*HEAD, "content.start", "content.delta", "content.end", "run.error"]
    assert found[-1].run_error.error.message.startswith(
        "provider 'pa': stream ended before completion"
    )
    assert asked(servers) == {"a": 1, "b": 0, "c": 0}
    assert states.aliases[0].deployments[0].state == "cooling_down"


async def test_an_alias_may_restart_the_call_elsewhere_visibly(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue([content("Hel"), CLOSE])
    servers["b"].enqueue([HttpError(503, "down")])
    servers["c"].enqueue(answer("Hello from c"))
    async with routed(agents, servers, alias={"restart_on_failure": True}) as gateway:
        found = await gateway.query("routed", "hi")
        await gateway.app.frontdoor.flush()
        chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=found[0].chat_id))
    assert kinds(found) == [
        *HEAD,
        "content.start",
        "content.delta",
        "content.end",  # the failed attempt's block, closed
        "model.fallback",  # said at every debug level
        "content.start",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    fell = found[6].model_fallback
    assert (fell.deployment, fell.attempt, fell.next_deployment, fell.restarted) == (
        "a",
        1,
        "b",
        True,
    )
    assert fell.error.message.startswith("provider 'pa': stream ended before completion")
    assert found[4].content_delta.content_id != found[8].content_delta.content_id
    assert found[8].content_delta.delta == "Hello from c"
    assert asked(servers) == {"a": 1, "b": 1, "c": 1}  # b failed before its first delta
    history = [e.type for e in chat.events]
    assert history == [*HEAD, "content.snapshot", "run.complete"]
    assert chat.events[3].content_snapshot.text == "Hello from c"


# -- context windows ------------------------------------------------------------------------


async def test_a_prompt_too_long_moves_on_to_a_longer_context(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    too_long = HttpError(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens.",
                "code": "context_length_exceeded",
            }
        },
    )
    servers["a"].enqueue([too_long], answer("a still fine"))
    servers["c"].enqueue(answer("from c"))
    lengths = {
        "a": {"context_length": 8192},
        "b": {"context_length": 8192},
        "c": {"context_length": 131072},
    }
    async with routed(agents, servers, deployments=lengths) as gateway:
        found = await gateway.query("routed", "hi")
        later = await gateway.query("routed", "hi")  # a was not cooled down
    assert text_of(found) == "from c" and text_of(later) == "a still fine"
    assert asked(servers) == {"a": 2, "b": 0, "c": 1}  # b's context is no longer


async def test_a_prompt_known_too_long_skips_the_short_deployments(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["b"].enqueue(answer("from b"))
    lengths = {"a": {"context_length": 50}, "b": {"context_length": 100000}}
    async with routed(agents, servers, deployments=lengths) as gateway:
        found = await gateway.query("routed", "Tell me. " * 100)  # ~225 tokens estimated
    assert text_of(found) == "from b"
    assert asked(servers) == {"a": 0, "b": 1, "c": 0}


# -- load balancing -------------------------------------------------------------------------


async def test_least_busy_sends_calls_where_fewer_are_in_flight(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    hold = asyncio.Event()
    servers["a"].enqueue([content("slow "), Gate(hold), content("a"), finish("stop"), DONE])
    servers["b"].enqueue(answer("b1"), answer("b2"))
    async with routed(agents, servers, alias={"strategy": "least_busy"}) as gateway:
        held = asyncio.create_task(gateway.query("routed", "hi"))
        await servers["a"]._wait(lambda: len(servers["a"].requests) == 1, 2.0, "a asked")
        first = await gateway.query("routed", "hi")
        second = await gateway.query("routed", "hi")
        hold.set()
        done = await held
    assert (text_of(first), text_of(second), text_of(done)) == ("b1", "b2", "slow a")
    assert asked(servers) == {"a": 1, "b": 2, "c": 0}


async def test_latency_routing_shifts_traffic_to_the_faster_deployment(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue([Pause(0.3), *answer("slow")])
    for _ in range(4):
        servers["b"].enqueue([Pause(0.01), *answer("fast")])
    async with routed(
        agents, servers, alias={"strategy": "latency", "deployments": ["a", "b"]}
    ) as gateway:
        texts = [text_of(await gateway.query("routed", "hi")) for _ in range(5)]
    # a, then b (not tried yet), then b: it answers first
    assert texts == ["slow", "fast", "fast", "fast", "fast"]
    assert asked(servers) == {"a": 1, "b": 4, "c": 0}


async def test_weighted_routing_follows_the_weights(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    for _ in range(80):
        servers["a"].enqueue(answer("a"))
        servers["b"].enqueue(answer("b"))
    weights = {"a": {"weight": 3}, "b": {"weight": 1}}
    alias = {"strategy": "weighted", "deployments": ["a", "b"]}
    async with routed(agents, servers, deployments=weights, alias=alias) as gateway:
        texts = [text_of(await gateway.query("routed", "hi")) for _ in range(80)]
    # 3:1 — the share of a is 0.75 (sd 0.05 over 80 calls): within four sd
    assert 44 <= texts.count("a") <= 76
    assert texts.count("a") + texts.count("b") == 80


# -- rate limits ------------------------------------------------------------------------------


async def test_a_deployment_at_its_rpm_is_passed_by_without_a_call(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    for _ in range(2):
        servers["a"].enqueue(answer("a"))
    servers["b"].enqueue(answer("b"))
    async with routed(agents, servers, deployments={"a": {"rpm": 2}}) as gateway:
        texts = [text_of(await gateway.query("routed", "hi")) for _ in range(3)]
        states = await gateway.stub.ListModels(gw.ListModelsRequest())
    assert texts == ["a", "a", "b"]
    a = states.aliases[0].deployments[0]
    assert (a.state, a.rpm_used, a.rpm_limit) == ("limited", 2, 2)
    assert a.reason == "at its limit of 2 calls a minute"


async def test_rpm_and_tpm_limits_hold_across_two_replicas(
    tmp_path: Path, agents: Path, servers: dict[str, LoopbackProvider], redis_url: str
) -> None:
    for _ in range(3):
        servers["a"].enqueue([content("a"), finish("stop"), usage(30, 10), DONE])
    for _ in range(6):
        servers["b"].enqueue(answer("b"))
    limits = {"a": {"rpm": 3}, "b": {"tpm": 1000000}}
    async with two_replicas(tmp_path, agents, servers, redis_url, limits) as (one, two):
        replicas = [one, two, one, two, one, two]
        texts = [text_of(await r.query("routed", "hi")) for r in replicas]
        assert texts == ["a", "a", "a", "b", "b", "b"]  # a's 3 calls a minute, whoever made them
        status = await two.stub.ListModels(gw.ListModelsRequest())
    a, b = status.aliases[0].deployments[:2]
    assert (a.rpm_used, a.state) == (3, "limited")
    assert (b.rpm_used, b.in_flight) == (3, 0)


async def test_tpm_counts_the_tokens_each_replica_used(
    tmp_path: Path, agents: Path, servers: dict[str, LoopbackProvider], redis_url: str
) -> None:
    servers["a"].enqueue([content("a"), finish("stop"), usage(900, 100), DONE], answer("never"))
    servers["b"].enqueue(answer("b"))
    async with two_replicas(tmp_path, agents, servers, redis_url, {"a": {"tpm": 1000}}) as (
        one,
        two,
    ):
        first = await one.query("routed", "hi")
        await asyncio.sleep(0.2)  # the release (with the tokens used) is not awaited by the run
        second = await two.query("routed", "hi")
    assert (text_of(first), text_of(second)) == ("a", "b")  # 1000 used: a is at its limit


async def test_least_busy_sees_the_calls_in_flight_of_the_other_replica(
    tmp_path: Path, agents: Path, servers: dict[str, LoopbackProvider], redis_url: str
) -> None:
    hold = asyncio.Event()
    servers["a"].enqueue([content("slow "), Gate(hold), content("a"), finish("stop"), DONE])
    servers["b"].enqueue(answer("b"))
    alias = {"strategy": "least_busy", "deployments": ["a", "b"]}
    async with two_replicas(tmp_path, agents, servers, redis_url, {}, alias=alias) as (one, two):
        held = asyncio.create_task(one.query("routed", "hi"))  # on a, held open
        await servers["a"]._wait(lambda: len(servers["a"].requests) == 1, 2.0, "a asked")
        await two.stub.ListModels(gw.ListModelsRequest())
        await asyncio.sleep(0.7)  # the counts of calls in flight are refreshed each 0.5 s
        elsewhere = await two.query("routed", "hi")
        hold.set()
        await held
    assert text_of(elsewhere) == "b"  # a is busy with the other replica's call
    assert asked(servers) == {"a": 1, "b": 1, "c": 0}


# -- naming an alias ------------------------------------------------------------------------


async def test_an_alias_is_named_as_a_model_a_provider_or_the_default(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    write_agent(agents, "by_key", oneshot_agent("Be brief.", modelConfig={"providerKey": "smart"}))
    write_agent(
        agents,
        "concrete",
        oneshot_agent("Be brief.", modelConfig={"providerKey": "pc", "model": "m"}),
    )
    write_agent(agents, "default", oneshot_agent("Be brief."))
    for _ in range(3):
        servers["a"].enqueue(answer("a"))
    servers["c"].enqueue(answer("c"))
    async with routed(agents, servers, default_provider="smart") as gateway:
        texts = [text_of(await gateway.query(k, "hi")) for k in ("by_key", "default", "routed")]
        concrete = await gateway.query("concrete", "hi")  # unchanged: a provider and a model
    assert texts == ["a", "a", "a"]
    assert text_of(concrete) == "c" and servers["c"].requests[0]["model"] == "m"


async def test_images_reach_an_alias_whose_providers_all_take_them(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    servers["a"].enqueue(answer("a"), answer("a"))
    async with routed(agents, servers, alias={"deployments": ["a", "b"]}) as gateway:
        upload = await gateway.stub.Upload(gw.UploadRequest(name="pic.png", content=png))
        await gateway.query("routed", "What is this?", references=[upload.reference])
        for name in ("pa", "pb"):
            gateway.app.settings.providers[name].image_input = True
        await gateway.query("routed", "What is this?", references=[upload.reference])
    assert asked(servers) == {"a": 2, "b": 0, "c": 0}
    without = servers["a"].requests[0]["messages"][-1]["content"]
    with_image = servers["a"].requests[1]["messages"][-1]["content"]
    assert not isinstance(without, list) or all(p["type"] == "text" for p in without)
    assert with_image[1]["image_url"]["url"].startswith("data:image/png;base64,")


# -- what shows -----------------------------------------------------------------------------


async def test_list_models_over_grpc_and_http(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    servers["a"].enqueue([HttpError(503, "down")])
    servers["b"].enqueue([content("ok"), finish("stop"), usage(10, 5), DONE])
    prices = {"b": {"price": {"input_per_million": 1.0, "output_per_million": 2.0}}}
    async with routed(agents, servers, deployments=prices) as gateway:
        await gateway.query("routed", "hi")
        response = await gateway.stub.ListModels(gw.ListModelsRequest())
        async with httpx.AsyncClient(base_url=gateway.http_url) as http:
            body = (await http.get("/api/models")).json()
    assert [p.key for p in response.providers] == ["pa", "pb", "pc"]
    assert response.providers[0].api == "openai"
    alias = response.aliases[0]
    assert (alias.name, alias.strategy, alias.restart_on_failure) == ("smart", "ordered", False)
    a, b, c = alias.deployments
    assert (a.name, a.provider, a.model, a.state) == ("a", "pa", "model-a", "cooling_down")
    assert (b.state, b.calls, b.failures, c.state, c.calls) == ("healthy", 1, 0, "healthy", 0)
    assert b.latency_ms > 0
    assert body["code"] == 0
    shown = body["data"]["aliases"][0]["deployments"]
    assert [(d["name"], d["state"]) for d in shown] == [
        ("a", "cooling_down"),
        ("b", "healthy"),
        ("c", "healthy"),
    ]
    assert shown[0]["reason"] == "provider 'pa': HTTP 503: down"


async def test_a_cancelled_call_closes_its_upstream_and_frees_its_deployment(
    agents: Path, servers: dict[str, LoopbackProvider]
) -> None:
    hold = asyncio.Event()
    servers["a"].enqueue([content("Hel"), Gate(hold), content("lo"), finish("stop"), DONE])
    async with routed(agents, servers) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="routed", message="hi"))
        seen = []
        async for event in call:
            seen.append(event)
            if event.type == "content.delta":
                await gateway.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
        await servers["a"].wait_disconnects(1, timeout=2.0)
        status = await gateway.stub.ListModels(gw.ListModelsRequest())
        hold.set()
    assert [e.type for e in seen][-2:] == ["content.end", "run.cancel"]
    a = status.aliases[0].deployments[0]
    assert (a.state, a.in_flight, a.calls, a.failures) == ("healthy", 0, 1, 0)


def test_settings_refuse_routes_to_nowhere() -> None:
    from pydantic import ValidationError

    from service.assembly.config import Settings

    provider = {"p": ProviderSettings(base_url="http://x/v1", keys={"team": "sk-t"})}
    cases = [
        (
            {"deployments": {"d": DeploymentSettings(provider="q", model="m")}},
            "deployment 'd': provider 'q' is not configured",
        ),
        (
            {"deployments": {"d": DeploymentSettings(provider="p", model="m", key="other")}},
            "deployment 'd': provider 'p' has no key 'other'",
        ),
        (
            {"aliases": {"smart": AliasSettings(deployments=["d"])}},
            "alias 'smart': unknown deployments d",
        ),
        (
            {
                "deployments": {"d": DeploymentSettings(provider="p", model="m")},
                "aliases": {"p": AliasSettings(deployments=["d"])},
            },
            "alias 'p': a provider has this name",
        ),
    ]
    for fields, message in cases:
        with pytest.raises(ValidationError, match=message):
            Settings(providers=provider, **fields)
    assert (
        Settings(
            providers=provider,
            deployments={"d": DeploymentSettings(provider="p", model="m", key="team")},
            aliases={"smart": AliasSettings(deployments=["d"])},
        )
        .aliases["smart"]
        .strategy
        == "ordered"
    )
