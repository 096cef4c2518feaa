"""Files out of the sandbox: a `_bash_` call's files are announced (`file.create`,
`file.update`), listed (ListFiles) and read (DownloadFile), over gRPC, HTTP and A2A, for
the chat's owner only, up to the download limit, and never through a link or `..`."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.types import a2a_pb2 as a2a
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, answer_turn, assert_invariants, call_turn, kinds, tools
from tests.gateway.a2a_kit import a2a_service, collect, text, user_message

WRITE = (
    "mkdir out && printf 'a,b\\n1,2\\n' > out/r.csv && echo hi > note.txt "
    "&& ln -s /etc/hostname leak"
)
CHANGE = "echo again >> note.txt && touch out/r.csv.tmp && rm out/r.csv.tmp"
KEYS = [{"key": "key-alice", "subject": "alice"}, {"key": "key-bob", "subject": "bob"}]


def bash(call_id: str, command: str) -> list:
    return call_turn((call_id, "_bash_", json.dumps({"command": command})))


def alice() -> tuple[tuple[str, str], ...]:
    return (("authorization", "Bearer key-alice"),)


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider):
    agents = tmp_path / "agents"
    write_agent(agents, "sh", agent(toolConfig=tools("_bash_")))
    async with Harness.start(
        agents,
        provider,
        bash_working_dir=tmp_path / "work",
        auth_api_keys=KEYS,
        download_max_bytes=1024,
    ) as harness:
        yield harness


async def test_files_a_call_writes_are_announced_listed_and_downloaded(
    service: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        bash("b1", WRITE), answer_turn("Wrote."), bash("b2", CHANGE), answer_turn("Ok.")
    )
    stub, who = service.stub, alice()
    query = gw.QueryRequest(agent_key="sh", message="write", chat_id="c1")
    first = [e async for e in stub.Query(query, metadata=who)]
    again = gw.QueryRequest(agent_key="sh", message="change", chat_id="c1")
    second = [e async for e in stub.Query(again, metadata=who)]
    listed = await stub.ListFiles(gw.ListFilesRequest(chat_id="c1"), metadata=who)
    chunks = [
        m
        async for m in stub.DownloadFile(
            gw.DownloadFileRequest(chat_id="c1", path="out/r.csv"), metadata=who
        )
    ]
    await service.app.frontdoor.flush()
    chat = await stub.GetChat(gw.GetChatRequest(chat_id="c1"), metadata=who)

    assert_invariants(first)
    call = ["tool.start", "tool.args", "tool.args", "tool.end"]
    assert kinds(first)[3:9] == [*call, "file.create", "file.create"]
    assert kinds(first)[9] == "tool.result"
    created = [
        (
            e.file_create.tool_id,
            e.file_create.path,
            e.file_create.size_bytes,
            e.file_create.mime_type,
        )
        for e in first
        if e.type == "file.create"
    ]
    assert created == [("b1", "note.txt", 3, "text/plain"), ("b1", "out/r.csv", 8, "text/csv")]
    # the second call changed one file (the one it made and removed again is not announced)
    assert [
        (e.type, e.file_update.path, e.file_update.size_bytes)
        for e in second
        if e.type.startswith("file.")
    ] == [("file.update", "note.txt", 9)]
    assert [(f.path, f.size_bytes, f.mime_type) for f in listed.files] == [
        ("note.txt", 9, "text/plain"),
        ("out/r.csv", 8, "text/csv"),
    ]  # the link is not a file of the workspace
    assert all(f.modified_at > 0 for f in listed.files)
    assert [(c.content_type, c.data) for c in chunks] == [("text/csv", b"a,b\n1,2\n")]
    # the history keeps the announcements where they streamed
    assert [e.type for e in chat.events if e.type.startswith("file.")] == [
        "file.create",
        "file.create",
        "file.update",
    ]


async def test_downloads_over_http_are_owned_bounded_and_stay_inside(
    service: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        bash(
            "b1",
            WRITE + " && head -c 2000 /dev/zero > big.bin && printf '<script>x</script>' > p.html",
        ),
        answer_turn("Wrote."),
    )
    query = gw.QueryRequest(agent_key="sh", message="write", chat_id="c1")
    [e async for e in service.stub.Query(query, metadata=alice())]
    base = f"{service.http_url}/api/chats/c1/files"
    mine, theirs = {"Authorization": "Bearer key-alice"}, {"Authorization": "Bearer key-bob"}
    async with httpx.AsyncClient() as http:
        csv = await http.get(f"{base}/out/r.csv", headers=mine)
        page = await http.get(f"{base}/p.html", headers=mine)
        listed = await http.get(base, headers=mine)
        big = await http.get(f"{base}/big.bin", headers=mine)
        link = await http.get(f"{base}/leak", headers=mine)
        escape = await http.get(f"{base}/out/..%2F..%2F..%2Fetc%2Fhostname", headers=mine)
        other = await http.get(f"{base}/out/r.csv", headers=theirs)
        other_list = await http.get(base, headers=theirs)
        nobody = await http.get(f"{service.http_url}/api/chats/nope/files", headers=mine)
    assert (csv.status_code, csv.content) == (200, b"a,b\n1,2\n")
    assert csv.headers["content-type"] == "text/csv"
    assert csv.headers["content-disposition"] == "attachment"
    assert csv.headers["x-content-type-options"] == "nosniff"
    # a page a tool wrote is a download, never a document of the adapter's origin
    assert page.headers["content-type"] == "text/html"
    assert page.headers["content-security-policy"].startswith("sandbox")
    assert [f["path"] for f in listed.json()["data"]["files"]] == [
        "big.bin",
        "note.txt",
        "out/r.csv",
        "p.html",
    ]
    assert big.status_code == 429
    assert big.json()["reason"] == "PAYLOAD_TOO_LARGE"
    assert big.json()["msg"] == "file 'big.bin' is 2000 bytes; downloads are limited to 1024"
    for refused in (link, escape):
        assert refused.status_code == 404
        assert refused.json()["reason"] == "NOT_FOUND"
    for hidden in (other, other_list, nobody):
        assert hidden.status_code == 404
        assert hidden.json()["reason"] == "CHAT_NOT_FOUND"


async def test_a_grpc_download_of_another_users_chat_is_not_found(
    service: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(bash("b1", WRITE), answer_turn("Wrote."))
    query = gw.QueryRequest(agent_key="sh", message="write", chat_id="c1")
    [e async for e in service.stub.Query(query, metadata=alice())]
    bob = (("authorization", "Bearer key-bob"),)
    with pytest.raises(grpc.aio.AioRpcError) as hidden:
        request = gw.DownloadFileRequest(chat_id="c1", path="note.txt")
        [m async for m in service.stub.DownloadFile(request, metadata=bob)]
    assert hidden.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a2a_gets_each_file_as_an_artifact_it_can_download(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(bash("b1", WRITE), answer_turn("Wrote."))
    async with a2a_service(tmp_path, provider, bash_working_dir=tmp_path / "work") as service:
        write_agent(tmp_path / "agents", "sh", agent(toolConfig=tools("_bash_")))
        service.harness.app.agents.load_all()
        client = await service.client("sh")
        responses = await collect(client.send_message(user_message(text("write"))))
        files = [
            r.artifact_update.artifact
            for r in responses
            if r.HasField("artifact_update")
            and r.artifact_update.artifact.artifact_id.startswith("file:")
        ]
        task = responses[0].task
        got = await client.get_task(a2a.GetTaskRequest(id=task.id))
        part = files[1].parts[0]
        downloaded = await service.http.get(part.url)
    assert [(f.artifact_id, f.name) for f in files] == [
        ("file:note.txt", "note.txt"),
        ("file:out/r.csv", "out/r.csv"),
    ]
    assert part.url == f"{service.harness.http_url}/api/chats/{task.context_id}/files/out/r.csv"
    assert (part.filename, part.media_type) == ("r.csv", "text/csv")
    assert downloaded.content == b"a,b\n1,2\n"
    assert [a.artifact_id for a in got.artifacts if a.artifact_id.startswith("file:")] == [
        "file:note.txt",
        "file:out/r.csv",
    ]
