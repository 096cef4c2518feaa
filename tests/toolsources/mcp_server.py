"""A tiny MCP server for the tests, run as its own process by them.

    python mcp_server.py stdio          # over stdin/stdout
    python mcp_server.py http           # streamable HTTP on a free loopback port,
                                        # printed as "port N" on stdout when listening

Tools: `echo` (its text back), `slow` (sleeps `seconds`), `big` (`size` characters
of text), `grow` (adds the tool `extra` and says the tool list changed), `crash`
(the process exits at once), `facts` (its process id, an environment variable).
Over HTTP, with `REQUIRED_TOKEN` set, a request without `Authorization: Bearer
<token>` is refused (401).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("test-tools")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
async def slow(seconds: float) -> str:
    """Wait, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} s"


@server.tool()
def big(size: int) -> str:
    """A long text."""
    return "x" * size


def extra(text: str) -> str:
    """A tool added while the server runs."""
    return f"extra {text}"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `extra`."""
    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
async def steps(count: int, ctx: Context) -> str:
    """Report progress `count` times, then answer."""
    for step in range(1, count + 1):
        await ctx.report_progress(step, count, f"step {step} of {count}")
    await ctx.report_progress(count + 1)  # a number alone, with no total and no message
    return f"{count} steps done"


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@server.tool()
def facts(variable: str) -> dict[str, object]:
    """The server's process id and the value (and length) of an environment variable."""
    value = os.environ.get(variable, "")
    return {"pid": os.getpid(), "value": value, "length": len(value)}


def serve_http() -> None:
    import uvicorn
    from starlette.responses import PlainTextResponse

    app = server.streamable_http_app()
    token = os.environ.get("REQUIRED_TOKEN", "")

    async def guarded(scope, receive, send):  # type: ignore[no-untyped-def]
        if token and scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await PlainTextResponse("who are you?", status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    print(f"port {listener.getsockname()[1]}", flush=True)
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    if sys.argv[1:] == ["http"]:
        serve_http()
    else:
        server.run("stdio")
