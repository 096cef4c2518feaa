"""The model's context window: what is done before a model call whose prompt grows too long.

The context length of a stage is its `modelConfig.contextLength`, else the length of a
known model of that name (`KNOWN_CONTEXT_LENGTHS`, by longest name prefix), else the
service's default (`AGW_CONTEXT_LENGTH`). Prompts are estimated by script (tokens.py: a
Chinese character counts most of a token, an English word about one): the messages
(`transcript.estimate_tokens`) and the tool schemas the call offers (`schema_tokens`),
which take context too. Before each model call of a stage
(`Conversation.ask`), in this order:

1. **Prune** (`prune_tool_outputs`): when the run's own messages (those after its user
   message) exceed `context.pruneAt` of the length, the outputs of its older tool calls
   (all but the newest `context.keepToolOutputs`) are replaced by a note naming the tool
   and the size of what was removed. Only the prompt changes: the events and the chat
   keep every output.
2. **Summarise** (`summarize`): when the whole prompt still exceeds `context.compressAt`
   of the length, the oldest turns of the chat's memory (all but the newest
   `context.keepTurns`) are summarised by one call of the stage's own model (provider,
   model and request-body fields; reasoning off; the only tool offered is
   `_context_summary_`, required) and replaced by one summary message. The summary is
   written into the run's next chat record (`summary`: its text and the newest run it
   covers), so the chat's later runs start from it instead of summarising again (see
   `memory.remembered`).
3. **Trim** (`truncate`): when there is nothing to summarise (no older turn but an
   earlier summary) or the summary call fails for any reason, the oldest whole turns
   are dropped until the prompt fits under the threshold. The run never fails for it.

Each step that changes the prompt emits `context.compress` with its strategy and the
prompt's messages and estimated tokens before and after. The summary call streams
nothing to the client — no reasoning, content or tool events: it is the service's
housekeeping, not the agent's answer. With debug events on, it appears as a paired
`model.start`/`model.end` of stage `context`; its tokens count in the run's usage, it
does not count against `budget.maxModelCalls`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from service.core import events
from service.core.agents.definition import ResolvedStage
from service.core.agents.schema import ContextConfig
from service.core.model import ModelRequest, Reasoning, Usage
from service.core.run.context import RunContext
from service.core.run.eventlog import Emitter
from service.core.run.observation import ModelCallObserver
from service.core.run.tokens import text_tokens
from service.core.run.transcript import (
    Message,
    PastRun,
    estimate_tokens,
    flatten,
    summary_run,
    tokens_at_most,
)
from service.core.tools.guards import MAX_LINE_CHARS
from service.core.tools.names import CONTEXT_SUMMARY_TOOL

log = logging.getLogger("agw.context")

DEFAULT_CONTEXT_LENGTH = 32_768
SUMMARY_STAGE = "context"

#: Context windows of well-known models, by model-name prefix (the longest matching wins).
KNOWN_CONTEXT_LENGTHS: dict[str, int] = {
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "deepseek-ai/": 128_000,
    "qwen-max": 32_768,
    "qwen-plus": 131_072,
    "qwen-turbo": 1_000_000,
    "qwen3-max": 262_144,
    "qwen3": 131_072,
    "llama3": 8_192,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "agw-demo": 8_192,
}

SUMMARY_PROMPT = (
    "You summarise the earlier part of a conversation between a user and an assistant, so "
    "that the assistant can go on without it. Keep what later turns may need: the user's "
    "goals and preferences, decisions made, facts and figures found (with tool results), "
    "open questions. Be brief and factual; write in the conversation's language. Answer "
    f"only by calling {CONTEXT_SUMMARY_TOOL} with the summary."
)
SUMMARY_SCHEMA = {
    "type": "function",
    "function": {
        "name": CONTEXT_SUMMARY_TOOL,
        "description": "Record the summary of the earlier conversation.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "The summary."}},
            "required": ["summary"],
        },
    },
}
_CLIP = MAX_LINE_CHARS  # characters of one message in the transcript given to summarise


def context_length(configured: int | None, model: str, default: int) -> int:
    """The context length of `model`: configured, else known by name, else `default`."""
    if configured:
        return configured
    name = model.lower().rsplit(":", 1)[0]
    known = [prefix for prefix in KNOWN_CONTEXT_LENGTHS if name.startswith(prefix)]
    return KNOWN_CONTEXT_LENGTHS[max(known, key=len)] if known else default


def schema_tokens(tools: Sequence[dict[str, Any]]) -> int:
    """The estimated tokens of the tool schemas a call offers (their JSON, by script)."""
    if not tools:
        return 0
    return round(text_tokens(json.dumps(list(tools), separators=(",", ":"), default=str)))


def pruned_note(name: str, size: int) -> str:
    """What an old tool output is replaced by in the prompt."""
    return f"[pruned to save context: the output of '{name or 'tool'}' ({size} characters)]"


def drop_oldest(
    memory: list[PastRun],
    too_big: Callable[[], bool],
    dropped: Callable[[PastRun], object] = lambda _run: None,
) -> int:
    """Drop the oldest whole runs of `memory` (in place) while `too_big()`: the one way the
    memory is trimmed, so a tool call never loses its result. How many were dropped."""
    count = 0
    while memory and too_big():
        dropped(memory.pop(0))
        count += 1
    return count


def fit_memory(memory: list[PastRun], max_tokens: int, out: Emitter) -> list[PastRun]:
    """Before a run: the chat's memory within the service's budget of `max_tokens` tokens
    (`AGW_CONTEXT_MAX_TOKENS`), its oldest whole runs dropped, with `context.compress`."""
    kept = list(memory)
    history = flatten(kept)
    if drop_oldest(kept, lambda: estimate_tokens(flatten(kept)) > max_tokens):
        fitted = flatten(kept)
        out.emit(
            events.context_compress(
                "truncate",
                len(history),
                len(fitted),
                estimate_tokens(history),
                estimate_tokens(fitted),
            )
        )
    return kept


class ContextWindow:
    """Keeps the prompts of one stage conversation within the model's context length."""

    __slots__ = (
        "ctx",
        "length",
        "schemas",
        "settings",
        "stage",
    )

    def __init__(
        self,
        ctx: RunContext,
        stage: ResolvedStage,
        model: str,
        tools: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.ctx = ctx
        self.stage = stage
        self.settings: ContextConfig = ctx.agent.context
        self.length = context_length(stage.model.context_length, model, ctx.services.context_length)
        self.schemas = schema_tokens(tools)  # the offered tools' part of every prompt

    def size(self, messages: list[Message]) -> int:
        """The estimated tokens of a prompt of `messages` with the offered tool schemas."""
        return estimate_tokens(messages) + self.schemas

    async def fit(self, messages: list[Message], own_start: int) -> None:
        """Prune, summarise or trim `messages` (in place) before a model call."""
        threshold = self.settings.compress_at * self.length
        limit = min(threshold - self.schemas, self.settings.prune_at * self.length)
        if tokens_at_most(messages) <= limit:
            return  # far from both limits, by their lengths alone: nothing to estimate
        self.prune(messages, own_start)
        if self.size(messages) <= threshold:
            return
        await self.summarise(messages, threshold)

    # -- pruning ----------------------------------------------------------------------

    def prune(self, messages: list[Message], own_start: int) -> None:
        own = messages[own_start:]
        if estimate_tokens(own) <= self.settings.prune_at * self.length:
            return
        outputs = [i for i in range(own_start, len(messages)) if messages[i]["role"] == "tool"]
        keep = self.settings.keep_tool_outputs
        older = outputs[: len(outputs) - keep] if keep else outputs
        before = self.size(messages)
        pruned = 0
        for index in older:
            message = messages[index]
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, default=str)
            note = pruned_note(str(message.get("name") or ""), len(text))
            if text.startswith("[pruned to save context") or len(text) <= len(note):
                continue
            messages[index] = {**message, "content": note}
            pruned += 1
        if pruned:
            self._emit("prune_tool_outputs", len(messages), len(messages), before, messages)

    # -- summarising ------------------------------------------------------------------

    async def summarise(self, messages: list[Message], threshold: float) -> None:
        memory = self.ctx.query.memory
        history = flatten(memory)
        if not _starts_with(messages, 1, history):  # a stage without the chat's memory
            return
        keep = self.settings.keep_turns
        old = memory[: len(memory) - keep] if keep else list(memory)
        if not any(turn.run_id for turn in old):
            self.trim(messages, threshold)
            return
        try:
            text = await self._summary(flatten(old))
        except Exception:
            log.warning("run %s: summarising failed; trimming", self.ctx.run.run_id, exc_info=True)
            text = ""
        if not text:
            self.trim(messages, threshold)
            return
        through = next(t.run_id or t.through for t in reversed(old))
        summary = summary_run(text, through)
        count = len(flatten(old))
        before_count, before = len(messages), self.size(messages)
        self._replace(messages, count, summary.messages)
        memory[: len(old)] = [summary]
        self.ctx.run.context_summary = {"text": text, "through": through}
        self._emit("summarize", before_count, len(messages), before, messages)

    def trim(self, messages: list[Message], threshold: float) -> None:
        """Drop the oldest whole runs of the chat's memory until the prompt fits."""
        before_count, before = len(messages), self.size(messages)
        dropped = drop_oldest(
            self.ctx.query.memory,
            lambda: self.size(messages) > threshold,
            lambda run: self._replace(messages, len(run.messages), []),
        )
        if dropped:
            self._emit("truncate", before_count, len(messages), before, messages)

    def _replace(self, messages: list[Message], count: int, new: list[Message]) -> None:
        """Replace the first `count` messages of the memory, in the prompt and the run's history."""
        history = self.ctx.query.history
        if _starts_with(history, 0, messages[1 : 1 + count]):
            history[:count] = new
        messages[1 : 1 + count] = new

    async def _summary(self, old: list[Message]) -> str:
        """The model's summary of `old` (empty when it gave none)."""
        ctx = self.ctx
        prompt = [
            {"role": "system", "content": SUMMARY_PROMPT},
            {"role": "user", "content": transcript(old)},
        ]
        client, request = ctx.model_call(
            self.stage,
            prompt,
            tools=[SUMMARY_SCHEMA],
            tool_choice="required",
            reasoning=Reasoning(False),
        )
        request.stage = SUMMARY_STAGE
        run = ctx.run

        def decode(data: dict[str, Any]) -> str:  # a journaled summary: its call counted
            usage = data.get("usage")
            run.accounting.add_call(Usage(**usage) if usage else None, data.get("cost", 0.0))
            return str(data["text"])

        collected: dict[str, Any] = {}
        return await ctx.out.step(
            "context summary",
            lambda: _collect(ctx, client, request, collected),
            lambda text: {"text": text, **collected},
            decode,
        )

    def _emit(self, strategy: str, count: int, after: int, before: int, now: list[Message]) -> None:
        self.ctx.out.emit(events.context_compress(strategy, count, after, before, self.size(now)))


async def _collect(
    ctx: RunContext, client: Any, request: ModelRequest, spent: dict[str, Any]
) -> str:
    """Run the summary call to its end, silently; its summary (the tool's argument or text).
    What the call used goes into `spent` (`usage`, `cost`)."""
    observer = ModelCallObserver(ctx.run, ctx.out, request)
    arguments: list[str] = []
    content: list[str] = []
    finish_reason = ""
    usage = None
    error: BaseException | None = None
    try:
        stream = client.stream(request)
        observer.opened()
        async with stream as deltas:
            async for delta in deltas:
                if delta.restart is not None:  # starts over elsewhere: its output so far void
                    content.clear()
                    arguments.clear()
                    observer.restarted(delta.restart)
                    continue
                content.append(delta.content or "")
                arguments += [fragment.arguments for fragment in delta.tool_calls]
                finish_reason = delta.finish_reason or finish_reason
                usage = delta.usage or usage
    except BaseException as exc:
        error = exc
        raise
    finally:
        observer.end(
            finish_reason=finish_reason,
            usage=usage,
            first_delta_ms=None,
            output="".join(arguments) or "".join(content),
            error=error,
        )
        spent.update(usage=asdict(usage) if usage is not None else None, cost=observer.cost)
    return _summary_text("".join(arguments), "".join(content))


def _summary_text(arguments: str, content: str) -> str:
    if arguments:
        try:
            value = json.loads(arguments)
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("summary"), str):
            return str(value["summary"]).strip()
    return content.strip()


def transcript(messages: list[Message]) -> str:
    """The turns to summarise as plain text, one line per message (each clipped)."""
    lines: list[str] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content") or ""
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        if role == "tool":
            lines.append(f"tool result: {_clip(text or '')}")
            continue
        if text:
            lines.append(f"{role}: {_clip(text)}")
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            name, args = function.get("name", ""), function.get("arguments", "")
            lines.append(f"{role} called {name}({_clip(str(args))})")
    return "\n".join(lines)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _CLIP else text[:_CLIP] + "…"


def _starts_with(messages: list[Message], start: int, prefix: list[Message]) -> bool:
    """Whether `messages[start:]` begins with the very message objects of `prefix`."""
    window = messages[start : start + len(prefix)]
    return len(window) == len(prefix) and all(a is b for a, b in zip(window, prefix, strict=True))
