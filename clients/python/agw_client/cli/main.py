"""`agw`: the gateway from a terminal.

    agw agents                         the loaded agents
    agw chat AGENT [--chat ID]         talk with an agent, turn after turn
    agw query AGENT "message" [--json] one run; --json prints its events as JSON lines
    agw attach RUN [--after SEQ]       re-join a running run's stream
    agw chats                          the chats, newest first
    agw chat-history CHAT [--json]     a chat's history

The gateway is at 127.0.0.1:50051 (`make run`) unless `--target` or `AGW_TARGET`
says otherwise (`AGW_TOKEN` for `--token`). Ctrl-C cancels the running run.
Exit status of `query` and `attach`: 0 when the run completed, 1 on an error, 130
when cancelled; `chat` leaves with 0. A gateway that cannot be reached exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import grpc
from agw.v1 import gateway_pb2 as gw

from agw_client.cli.render import Renderer
from agw_client.cli.session import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Prompter, Session
from agw_client.errors import RpcError
from agw_client.messages import event_to_dict, message_to_dict
from agw_client.options import ClientOptions, default_target
from agw_client.sync import Client


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument(
        "--target",
        default=default_target(),
        help="gateway address, host:port (env AGW_TARGET; default %(default)s)",
    )
    group.add_argument("--tls", action="store_true", help="connect with TLS")
    group.add_argument("--ca-cert", type=Path, help="PEM root certificates for TLS")
    group.add_argument(
        "--token", default=os.environ.get("AGW_TOKEN"), help="bearer token (env AGW_TOKEN)"
    )
    group.add_argument(
        "--timeout", type=float, default=30.0, help="deadline of unary calls, seconds"
    )
    group.add_argument(
        "--reattach-attempts",
        type=int,
        default=ClientOptions.reattach_attempts,
        metavar="N",
        help="a stream cut as its gateway process shuts down (or a query it refused) is "
        "followed on: re-attached (or sent again) at most N times in a row (default %(default)s)",
    )
    group.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="ANSI colors"
    )
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    root = argparse.ArgumentParser(
        prog="agw", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = commands.add_parser
    sub = add("agents", parents=[common], help="list the loaded agents")
    sub.add_argument("--json", action="store_true", help="one JSON object per agent")
    sub = add("chat", parents=[common], help="talk with an agent, turn after turn")
    sub.add_argument("agent")
    sub.add_argument("--chat", default="", help="continue this chat")
    sub = add("query", parents=[common], help="run one query and show it")
    sub.add_argument("agent")
    sub.add_argument("message")
    sub.add_argument("--chat", default="", help="continue this chat")
    sub.add_argument(
        "--mode",
        choices=("ONESHOT", "REACT", "PLAN_EXECUTE"),
        help="run in this mode, one the agent allows (default: the agent's mode)",
    )
    sub.add_argument("--json", action="store_true", help="print the events as JSON lines")
    sub = add("attach", parents=[common], help="re-join a running run's stream")
    sub.add_argument("run")
    sub.add_argument("--after", type=int, default=0, help="replay the events after this seq")
    sub.add_argument("--json", action="store_true", help="print the events as JSON lines")
    sub = add("chats", parents=[common], help="list the chats, newest first")
    sub.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    sub.add_argument("--json", action="store_true", help="one JSON object per chat")
    sub = add("chat-history", parents=[common], help="show a chat's history")
    sub.add_argument("chat")
    sub.add_argument("--json", action="store_true", help="print the events as JSON lines")
    return root


class Cli:
    """One invocation of `agw`."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        self.args, self.out, self.err = args, out, err
        color = args.color == "always" or (
            args.color == "auto" and out.isatty() and "NO_COLOR" not in os.environ
        )
        self.renderer = Renderer(out, err, color=color)
        ca = args.ca_cert.read_bytes() if args.ca_cert else None
        self.client = Client(
            options=ClientOptions(
                target=args.target,
                tls=args.tls,
                root_certificates=ca,
                token=args.token,
                timeout=args.timeout,
                reattach_attempts=args.reattach_attempts,
            )
        )

    def run(self) -> int:
        handler = getattr(self, "cmd_" + self.args.command.replace("-", "_"))
        with self.client:
            try:
                code: int = handler()
            finally:
                self.renderer.end_line()  # the output ends with a whole line, whatever happened
            return code

    def _print(self, text: str) -> None:
        self.out.write(text + "\n")

    def _session(self, *, interactive: bool) -> Session:
        json_lines = getattr(self.args, "json", False)
        prompter = None
        if interactive and not json_lines:
            prompter = Prompter(self.renderer, echo=not sys.stdin.isatty())
        return Session(self.client, self.renderer, prompter, json_lines=json_lines)

    def cmd_agents(self) -> int:
        agents = self.client.list_agents()
        if self.args.json:
            for agent in agents:
                self._print(json.dumps(message_to_dict(agent), ensure_ascii=False))
            return EXIT_OK
        rows: list[tuple[str, ...]] = [("KEY", "MODE", "NAME", "DESCRIPTION")]
        for a in agents:
            mode = gw.AgentMode.Name(a.mode).removeprefix("AGENT_MODE_")
            rows.append((a.key, mode, a.name, a.description))
        self._table(fit(rows, shutil.get_terminal_size().columns))
        return EXIT_OK

    def cmd_query(self) -> int:
        session = self._session(interactive=True)
        fields: dict[str, Any] = {"chat_id": self.args.chat}
        if self.args.mode:
            fields["mode"] = f"AGENT_MODE_{self.args.mode}"
        stream = self.client.query(self.args.agent, self.args.message, **fields)
        return session.exit_code(session.follow(stream))

    def cmd_attach(self) -> int:
        session = self._session(interactive=True)
        stream = self.client.attach(self.args.run, self.args.after)
        return session.exit_code(session.follow(stream))

    def cmd_chat(self) -> int:
        session = self._session(interactive=True)
        assert session.prompter is not None
        chat_id = self.args.chat
        self.renderer.notice(f"chat with {self.args.agent}: Ctrl-C cancels a run, Ctrl-D leaves")
        while True:
            try:
                message = session.prompter.ask("you> ")
            except KeyboardInterrupt:
                message = None
            if message is None or message.strip() in ("/quit", "/exit"):
                break
            if not message.strip():
                continue
            stream = self.client.query(self.args.agent, message, chat_id=chat_id)
            session.follow(stream)  # a failed or cancelled run is shown; the chat goes on
            chat_id = stream.chat_id or chat_id
        if chat_id:
            self.renderer.notice(f"chat {chat_id}: agw chat {self.args.agent} --chat {chat_id}")
        return EXIT_OK

    def cmd_chats(self) -> int:
        rows: list[tuple[str, ...]] = [("CHAT", "UPDATED", "RUNS", "AGENT", "NAME")]
        for number, chat in enumerate(self.client.iter_chats(min(self.args.limit, 100)), 1):
            if number > self.args.limit:
                break
            if self.args.json:
                self._print(json.dumps(message_to_dict(chat), ensure_ascii=False))
                continue
            updated = datetime.fromtimestamp(chat.updated_at / 1000).strftime("%Y-%m-%d %H:%M")
            runs = str(chat.run_count)
            rows.append((chat.chat_id, updated, runs, chat.agent_key, chat.chat_name))
        if not self.args.json:
            self._table(rows)
        return EXIT_OK

    def cmd_chat_history(self) -> int:
        chat = self.client.get_chat(self.args.chat)
        if self.args.json:
            for event in chat.events:
                self._print(json.dumps(event_to_dict(event), ensure_ascii=False))
            return EXIT_OK
        self.renderer.history = True
        if chat.chat_name:
            self.renderer.line(self.renderer.style.bold(f"# {chat.chat_name}"))
        for event in chat.events:
            self.renderer.event(event)
        return EXIT_OK

    def _table(self, rows: list[tuple[str, ...]]) -> None:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            self._print("  ".join([*cells, row[-1]]).rstrip())


#: The narrowest a table's last column is cut to, and the column before it.
MIN_LAST, MIN_CUT = 20, 12


def fit(rows: list[tuple[str, ...]], width: int) -> list[tuple[str, ...]]:
    """The table's rows cut to `width` columns (at least 80): the last column to what is
    left, the one before it first when the last would get less than 20 characters."""
    width = max(width, 80)
    columns = len(rows[0])
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    used = sum(widths[:-1]) + 2 * (columns - 1)
    if columns > 2 and width - used < MIN_LAST:  # the next-to-last column gives some up
        widths[-2] = max(MIN_CUT, widths[-2] - (MIN_LAST - (width - used)))
        used = sum(widths[:-1]) + 2 * (columns - 1)
    limits = [*widths[:-1], max(width - used, MIN_LAST)]
    return [
        tuple(_cut(cell, limit) for cell, limit in zip(row, limits, strict=True)) for row in rows
    ]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure(error: RpcError, target: str) -> str:
    """The one line that says why a call failed."""
    if error.code == grpc.StatusCode.UNAVAILABLE and not error.reason:  # no answer at all
        return f"cannot reach agw at {target} (is it running? `make run`)"
    return str(error)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `agw` command."""
    args = parser().parse_args(argv)
    try:
        code = Cli(args, sys.stdout, sys.stderr).run()
    except RpcError as error:
        print(f"agw: {failure(error, args.target)}", file=sys.stderr)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        print(file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        code = EXIT_FAILED
    sys.exit(code)
