"""Tool sources that run tools outside the service: MCP servers and HTTP endpoints.

Each is a `ToolSource` (service/core/tools/sources.py) registered by the assembly
(service/assembly/app.py) and taking plain values, never the settings:

- `mcp.McpServer`: one configured MCP server (stdio or streamable HTTP), its tools
  offered as backend tools, kept connected and re-listed when they change by its
  `mcp.McpSession`;
- `http.HttpTools`: the `.backend` entries with a `toolApi` URL, run by an HTTP call.

`references` resolves `${ENV:NAME}` references in their configuration and keeps
the resolved secrets out of messages, logs and URLs shown.
"""
