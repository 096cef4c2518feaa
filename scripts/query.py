"""Run one query and print its events: `scripts/query.py AGENT "message" [--target HOST:PORT]`.

One line per event: its seq, its type and its payload as compact JSON (camelCase,
numbers as numbers, 64-bit ones too). The target is `--target`, else `AGW_TARGET`,
else 127.0.0.1:50051.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import grpc
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from agw_client.messages import message_to_dict, payload_of


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("agent")
    parser.add_argument("message")
    parser.add_argument("--target", default=os.environ.get("AGW_TARGET") or "127.0.0.1:50051")
    parser.add_argument("--chat", default="", help="continue this chat id")
    args = parser.parse_args()
    async with grpc.aio.insecure_channel(args.target) as channel:
        stub = gateway_pb2_grpc.AgentGatewayStub(channel)
        request = gw.QueryRequest(agent_key=args.agent, message=args.message, chat_id=args.chat)
        try:
            async for event in stub.Query(request):
                message = payload_of(event)
                payload = message_to_dict(message) if message is not None else {}
                text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
                print(event.seq, event.type, text, flush=True)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE and not error.trailing_metadata():
                reason = f"cannot reach agw at {args.target} (is it running? `make run`)"
            else:
                reason = f"{error.code().name}: {error.details()}"
            print(f"error: {reason}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
