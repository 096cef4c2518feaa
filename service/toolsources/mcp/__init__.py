"""MCP servers as tool sources: each configured server's tools, offered as backend tools.

Two rooms: `session.McpSession` keeps the connection to one server with the
official `mcp` SDK (connect, re-list, ping, reconnect after a back-off, call);
`source.McpServer` is the `ToolSource` the registry reads, the session's listed
tools as backend tool definitions and their handlers. `options.McpServerOptions`
is what the assembly configures.
"""

from service.toolsources.mcp.options import McpServerOptions
from service.toolsources.mcp.session import McpSession
from service.toolsources.mcp.source import McpServer

__all__ = ["McpServer", "McpServerOptions", "McpSession"]
