"""Run one query and print its events: `scripts/query.py AGENT "message" [--target HOST:PORT]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from google.protobuf import json_format


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("agent")
    parser.add_argument("message")
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--chat", default="", help="continue this chat id")
    args = parser.parse_args()
    async with grpc.aio.insecure_channel(args.target) as channel:
        stub = gateway_pb2_grpc.AgentGatewayStub(channel)
        request = gw.QueryRequest(agent_key=args.agent, message=args.message, chat_id=args.chat)
        try:
            async for event in stub.Query(request):
                field = event.WhichOneof("payload") or ""
                payload = json_format.MessageToDict(getattr(event, field))
                print(event.seq, event.type, json.dumps(payload, ensure_ascii=False), flush=True)
        except grpc.aio.AioRpcError as error:
            print(f"error: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
