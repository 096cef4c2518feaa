"""How the native wires convert the core's OpenAI-style requests, case by case.

The request body is a pure function of the request: these check the conversions a
recording cannot show (each rule of the APIs the conversion keeps to), on the bodies
the wires build.
"""

from __future__ import annotations

from typing import Any

from service.core.model import ModelRequest, Reasoning
from service.providers import anthropic_wire, gemini_wire
from service.providers.openai_wire import request_body as openai_body

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
SIGNED = {"api": "anthropic", "type": "thinking", "thinking": "Let me look.", "signature": "c2ln"}
GEMINI_SIGNED = {"api": "gemini", "call": "call_1", "signature": "Z2Vt"}


def req(messages: list[dict[str, Any]], **options: Any) -> ModelRequest:
    return ModelRequest(provider="p", model="m", messages=messages, **options)


def conversation(signatures: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "x"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
        ],
    }
    if signatures is not None:
        assistant["_signatures"] = signatures
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find x."},
        assistant,
        {"role": "tool", "tool_call_id": "call_1", "content": '{"found": 1}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "nothing"},
    ]


# -- Anthropic ------------------------------------------------------------------------------


def anthropic(request: ModelRequest) -> dict[str, Any]:
    return anthropic_wire.request_body(request, 4096, {})


def test_anthropic_tool_results_are_one_user_turn_after_the_signed_calls() -> None:
    body = anthropic(req(conversation([SIGNED, GEMINI_SIGNED]), tools=[TOOL], tool_choice="auto"))
    assert body["system"] == [{"type": "text", "text": "Be brief."}]
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "c2ln"},
                {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "x"}},
                {"type": "tool_use", "id": "call_2", "name": "lookup", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [{"type": "text", "text": '{"found": 1}'}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": [{"type": "text", "text": "nothing"}],
                },
            ],
        },
    ]
    assert body["tools"] == [
        {
            "name": "lookup",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            "description": "Look something up.",
        }
    ]
    assert body["tool_choice"] == {"type": "auto"}


def test_anthropic_thinking_budget_and_what_turns_it_off() -> None:
    on = Reasoning(True, "HIGH")
    body = anthropic(req([{"role": "user", "content": "hi"}], reasoning=on, temperature=0.2))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4095}  # under max_tokens
    assert body["max_tokens"] == 4096 and "temperature" not in body
    # a forced tool choice: the API refuses thinking with it
    forced = anthropic(
        req([{"role": "user", "content": "hi"}], reasoning=on, tools=[TOOL], tool_choice="required")
    )
    assert "thinking" not in forced and forced["tool_choice"] == {"type": "any"}
    # continuing after tool calls no thinking block precedes (another API's answer)
    foreign = anthropic(req(conversation([GEMINI_SIGNED]), reasoning=on, tools=[TOOL]))
    assert "thinking" not in foreign
    signed = anthropic(req(conversation([SIGNED]), reasoning=on, tools=[TOOL]))
    assert signed["thinking"]["type"] == "enabled"
    named = {"type": "function", "function": {"name": "lookup"}}
    assert anthropic(req(conversation(), tools=[TOOL], tool_choice=named))["tool_choice"] == {
        "type": "tool",
        "name": "lookup",
    }


def test_anthropic_images_and_cache_control_pass_through() -> None:
    content = [
        {"type": "text", "text": "What is it?", "cache_control": {"type": "ephemeral"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]
    body = anthropic(
        req([{"role": "user", "content": content}], extra_body={"metadata": {"user_id": "u"}})
    )
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is it?", "cache_control": {"type": "ephemeral"}},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            ],
        }
    ]
    assert body["metadata"] == {"user_id": "u"}


# -- Gemini ---------------------------------------------------------------------------------


def gemini(request: ModelRequest) -> dict[str, Any]:
    return gemini_wire.request_body(request, {})


def test_gemini_calls_get_their_signatures_back_and_results_their_names() -> None:
    body = gemini(req(conversation([SIGNED, GEMINI_SIGNED]), tools=[TOOL], tool_choice="required"))
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "Find x."}]},
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"id": "call_1", "name": "lookup", "args": {"q": "x"}},
                    "thoughtSignature": "Z2Vt",
                },
                {
                    "functionCall": {"id": "call_2", "name": "lookup", "args": {}},
                    "thoughtSignature": "skip_thought_signature_validator",
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "call_1", "name": "lookup", "response": {"found": 1}}},
                {
                    "functionResponse": {
                        "id": "call_2",
                        "name": "lookup",
                        "response": {"result": "nothing"},
                    }
                },
            ],
        },
    ]
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "lookup",
                    "description": "Look something up.",
                    "parametersJsonSchema": {
                        "type": "object",
                        "properties": {"q": {"type": "string"}},
                    },
                }
            ]
        }
    ]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


def test_gemini_generation_config_and_images() -> None:
    content = [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
    ]
    named = {"type": "function", "function": {"name": "lookup"}}
    body = gemini(
        req(
            [{"role": "user", "content": content}],
            tools=[TOOL],
            tool_choice=named,
            temperature=0.5,
            top_p=0.9,
            max_tokens=100,
            reasoning=Reasoning(True, "MEDIUM"),
        )
    )
    assert body["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "What is it?"},
                {"inlineData": {"mimeType": "image/jpeg", "data": "/9j/"}},
            ],
        }
    ]
    assert body["generationConfig"] == {
        "temperature": 0.5,
        "topP": 0.9,
        "maxOutputTokens": 100,
        "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192},
    }
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["lookup"]}
    }


# -- OpenAI ---------------------------------------------------------------------------------


def test_openai_requests_carry_no_other_api_signatures() -> None:
    messages = conversation([SIGNED, GEMINI_SIGNED])
    body = openai_body(req(messages), "none", {})
    assert all("_signatures" not in m for m in body["messages"])
    assert body["messages"][2]["tool_calls"] == messages[2]["tool_calls"]
    plain = [{"role": "user", "content": "hi"}]
    assert openai_body(req(plain), "none", {})["messages"] is plain  # nothing to copy
