"""Testing support, public for users too: fakes shipped with the code they stand in for.

- `Harness`: the whole service on loopback (gRPC, the HTTP adapter), in front of a
  `LoopbackProvider` (`service.providers.loopback`, also the demo model's server);
  `InProcess`: the core alone, no socket, with one in-process model; `serve_gateway`: a
  scripted AgentGateway on loopback, for clients' tests (`harness`);
- `ScriptedModel`: that in-process model, playing queued turns through the model port,
  and the builders of its turns (`content`, `finish`, `tool_call`, ...; `scripted`);
- `PostgresServer`, `RedisServer`: throwaway servers on loopback for tests and
  benchmarks (`servers`).

    model = ScriptedModel()
    async with InProcess.start(agents_dir, model) as core:
        model.enqueue([content("Hi"), finish("stop")])
        events = await core.query("my_agent", "Hello")
"""

from service.providers.loopback import DONE, Gate, Pause
from service.testing.harness import (
    FAKE_MODEL,
    FAKE_PROVIDER,
    Harness,
    InProcess,
    oneshot_agent,
    serve_gateway,
    write_agent,
)
from service.testing.scripted import (
    ScriptedCall,
    ScriptedModel,
    StreamError,
    content,
    fail,
    finish,
    reasoning,
    tool_call,
    tool_call_part,
    tool_calls,
    usage,
)
from service.testing.servers import (
    PostgresServer,
    RedisServer,
    ServerUnavailable,
    free_port,
    postgres_bindir,
    redis_binary,
)

__all__ = [
    "DONE",
    "FAKE_MODEL",
    "FAKE_PROVIDER",
    "Gate",
    "Harness",
    "InProcess",
    "Pause",
    "PostgresServer",
    "RedisServer",
    "ScriptedCall",
    "ScriptedModel",
    "ServerUnavailable",
    "StreamError",
    "content",
    "fail",
    "finish",
    "free_port",
    "oneshot_agent",
    "postgres_bindir",
    "reasoning",
    "redis_binary",
    "serve_gateway",
    "tool_call",
    "tool_call_part",
    "tool_calls",
    "usage",
    "write_agent",
]
