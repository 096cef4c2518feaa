"""Chat memory: the window of the last k runs and the messages given to the model."""

from __future__ import annotations

from service.core.chats.memory import conversation, last_runs


def text(t: str) -> list[dict]:
    return [{"type": "text", "text": t}]


def run_records(run: str, question: str, answer: str) -> list[dict]:
    return [
        {"_type": "query", "runId": run, "query": {"message": question}},
        {
            "_type": "step",
            "runId": run,
            "_seq": 1,
            "messages": [
                {"role": "user", "content": text(question), "ts": 1},
                {"role": "assistant", "reasoning_content": text("thinking..."), "_msgId": "m1"},
                {"role": "assistant", "content": text(answer), "_msgId": "m1", "_contentId": "x"},
            ],
        },
    ]


def test_window_keeps_the_last_k_runs_whole() -> None:
    records = [r for n in range(5) for r in run_records(f"r{n}", f"q{n}", f"a{n}")]
    assert {r["runId"] for r in last_runs(records, 2)} == {"r3", "r4"}
    messages = conversation(records, 2)
    assert messages == [
        {"role": "user", "content": "q3"},
        {"role": "assistant", "content": "a3"},
        {"role": "user", "content": "q4"},
        {"role": "assistant", "content": "a4"},
    ]
    assert conversation(records, 0) == []


def test_reasoning_is_never_sent_back() -> None:
    messages = conversation(run_records("r", "q", "a"), 20)
    assert all("reasoning" not in str(m) and "thinking" not in str(m) for m in messages)


def test_parallel_tool_calls_are_merged_back_in_openai_order() -> None:
    call = lambda i, name: {  # noqa: E731
        "role": "assistant",
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
        "_msgId": "m1",
        "_toolId": f"call_{i}",
    }
    result = lambda i, out: {  # noqa: E731
        "role": "tool",
        "name": "t",
        "tool_call_id": f"call_{i}",
        "content": text(out),
        "_toolId": f"call_{i}",
    }
    records = [
        {
            "_type": "step",
            "runId": "r",
            "messages": [
                {"role": "user", "content": text("weather?")},
                {"role": "assistant", "content": text("Let me check."), "_msgId": "m1"},
                call(1, "weather"),
                call(2, "clock"),
                result(2, "12:00"),
                result(1, "sunny"),
            ],
        },
        {
            "_type": "step",
            "runId": "r",
            "messages": [{"role": "assistant", "content": text("Sunny at noon."), "_msgId": "m2"}],
        },
    ]
    assert conversation(records, 20) == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": "{}"},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "clock", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny at noon."},
    ]


def test_a_tool_call_without_result_is_dropped() -> None:
    records = [
        {
            "_type": "step",
            "runId": "r",
            "messages": [
                {"role": "user", "content": text("go")},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "t", "arguments": "{"}}
                    ],
                    "_msgId": "m",
                },
            ],
        }
    ]
    assert conversation(records, 20) == [{"role": "user", "content": "go"}]


def test_image_parts_are_kept_as_parts() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    records = [
        {
            "_type": "step",
            "runId": "r",
            "messages": [{"role": "user", "content": [*text("look"), image]}],
        }
    ]
    assert conversation(records, 20) == [{"role": "user", "content": [*text("look"), image]}]


def test_fit_memory_drops_the_oldest_whole_runs() -> None:
    from service.core.run.eventlog import EventLog
    from service.core.run.transcript import PastRun, estimate_tokens, flatten
    from service.core.run.window import fit_memory

    first = PastRun(
        "r1",
        [
            {"role": "user", "content": "a" * 400},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            {"role": "tool", "tool_call_id": "c", "content": "b" * 400},
        ],
    )
    second = PastRun(
        "r2", [{"role": "user", "content": "c" * 40}, {"role": "assistant", "content": "d" * 40}]
    )
    memory = [first, second]
    log = EventLog("run", "chat")
    assert fit_memory(memory, 10_000, log.scope()) == memory
    assert len(log) == 0  # nothing dropped, nothing said
    kept = fit_memory(memory, 40, log.scope())
    assert kept == [second]  # the tool call and its result went together
    assert memory == [first, second]  # the chat's memory itself is untouched
    assert estimate_tokens(flatten(kept)) <= 40
    (event,) = list(log)
    assert event.type == "context.compress"
    compress = event.context_compress
    assert (compress.strategy, compress.messages_before, compress.messages_after) == (
        "truncate",
        5,
        2,
    )
    assert fit_memory(memory, 5, log.scope()) == []
