"""A conversation with the model within one stage: its messages, turns and tool rounds.

The modes are built from it. `ask` makes one model call under the run's policies
(budget, tool policy, reasoning output) and streams it; `execute`/`refuse`/`reply`
answer the calls of a turn and `record` appends the answers after the turn's
assistant message, in OpenAI's order (the assistant message with its
`tool_calls`, then one `tool` message per call). `converge` is the loop of
ONESHOT and REACT: ask, run the tools, ask again, until the model answers
without calling a tool — with the answer checked by a second pass when the
agent's verify policy says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from service.core.agents.definition import ResolvedStage
from service.core.model import SIGNATURES, ModelClient, ModelRequest, Reasoning, ToolChoice
from service.core.run.context import Outcome, RunContext, RunStopped
from service.core.run.executor import LOOP_STOPPED, ToolOutcome
from service.core.run.passes import second_pass, summarize_reasoning
from service.core.run.results import ToolCall, TurnResult
from service.core.run.turn import stream_turn, turn_step
from service.core.run.window import ContextWindow
from service.core.tools.registry import StageTools

ONE_TOOL_PER_ROUND = "not executed: only one tool call per round is allowed; call it again later"
NO_MORE_TOOLS = "not executed: no more tool calls are allowed in this run; answer now"


def assistant_message(turn: TurnResult) -> dict[str, Any]:
    """The turn as the assistant message sent back to the model (reasoning is not; what
    its API needs to continue after it is, in `_signatures`)."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.ref,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments or "{}"},
            }
            for call in turn.tool_calls
        ]
    elif message["content"] is None:
        message["content"] = ""
    if turn.signatures:
        message[SIGNATURES] = list(turn.signatures)
    return message


class Conversation:
    """The messages of one stage (or one plan task) and the calls that extend them."""

    __slots__ = (
        "ctx",
        "messages",
        "own_start",
        "stage",
        "tools",
    )

    def __init__(
        self,
        ctx: RunContext,
        stage: ResolvedStage,
        tools: StageTools,
        messages: list[dict[str, Any]],
        own_start: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.stage = stage
        self.tools = tools
        self.messages = messages
        # Where the run's own messages (after its user message) begin: what pruning may touch.
        self.own_start = len(messages) if own_start is None else own_start

    @classmethod
    def open(
        cls,
        ctx: RunContext,
        stage: ResolvedStage,
        user: dict[str, Any] | str | None = None,
        *,
        tools: StageTools | None = None,
        history: bool = True,
    ) -> Conversation:
        """A conversation of `stage`: its system prompt (with tool hints), the chat, `user`."""
        if tools is None:
            tools = ctx.stage_tools(stage)
        if user is None:
            user = ctx.query.user_message or {
                "role": ctx.command.role or "user",
                "content": ctx.command.message,
            }
        elif isinstance(user, str):
            user = {"role": "user", "content": user}
        messages = [{"role": "system", "content": ctx.system_prompt(stage, tools)}]
        if history:
            messages += ctx.query.history
        messages.append(user)
        return cls(ctx, stage, tools, messages)

    async def ask(
        self,
        *,
        tool_choice: ToolChoice | dict[str, Any] | None = None,
        ordinary: bool = True,
        planning: bool = True,
        reasoning: bool | None = None,
        emit_content: bool = True,
    ) -> TurnResult:
        """One model call with the offered tools; its assistant message is appended."""
        ctx = self.ctx
        policies = ctx.policies
        policies.budgets.use_model_call()
        offers_ordinary = ordinary and bool(self.tools.ordinary)
        if offers_ordinary:
            ctx.executor.describe_sources(self.tools.ordinary)
        schemas = self.tools.schemas(ordinary=ordinary, planning=planning)
        if tool_choice is None and schemas:
            tool_choice = policies.tool_choice(offers_ordinary)
        options: dict[str, Any] = {}
        if schemas:
            options["tools"] = schemas
            if tool_choice is not None:
                options["tool_choice"] = tool_choice
        if reasoning is not None:
            options["reasoning"] = Reasoning(reasoning, self.stage.model.reasoning.effort)
        client, request = ctx.model_call(self.stage, list(self.messages), **options)
        # Not kept while the turn streams: the window is needed for the fit only.
        await ContextWindow(ctx, self.stage, request.model, request.tools).fit(
            self.messages, self.own_start
        )
        request.messages = list(self.messages)
        turn = await turn_step(
            ctx.run, ctx.out, request, _Streamed(self, client, request, emit_content)
        )
        policies.record(turn)
        self.messages.append(assistant_message(turn))
        return turn

    async def execute(self, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        """Run ordinary tool calls (concurrently), after charging the tool-call budget."""
        if not calls:
            return []
        self.ctx.policies.budgets.use_tool_calls(len(calls))
        outcomes = await self.ctx.executor.execute(calls, self.tools.by_name)
        if any(outcome.stop for outcome in outcomes):
            raise RunStopped(LOOP_STOPPED)
        return outcomes

    def refuse(self, call: ToolCall, reason: str) -> ToolOutcome:
        return self.ctx.executor.refuse(call, reason)

    def _refuse_all(self, calls: Sequence[ToolCall], reason: str) -> list[ToolOutcome]:
        return [self.refuse(call, reason) for call in calls]

    def reply(self, call: ToolCall, result: Any, *, error: bool = False) -> ToolOutcome:
        """Answer a call the mode handles itself (a planning tool)."""
        return self.ctx.executor.report(ToolOutcome(call, result, error))

    def record(self, outcomes: Sequence[ToolOutcome]) -> None:
        """Append the `tool` messages answering the last turn's calls (given in call order)."""
        self.messages += [outcome.message() for outcome in outcomes]

    async def round(self, turn: TurnResult, *, one_tool: bool) -> None:
        """Execute the calls of `turn` (only the first when `one_tool`); record the answers."""
        self.ctx.policies.budgets.use_step()
        calls = turn.tool_calls
        run_now = calls[:1] if one_tool else calls
        outcomes = await self.execute(run_now)
        outcomes += self._refuse_all(calls[len(run_now) :], ONE_TOOL_PER_ROUND)
        self.record(outcomes)

    async def converge(
        self,
        *,
        max_rounds: int | None = None,
        one_tool: bool = False,
        stop_at: frozenset[str] = frozenset(),
    ) -> TurnResult:
        """Ask and run tools until the model answers without a tool call.

        After `max_rounds` tool rounds the model is asked once more with
        `tool_choice=none` for its final answer. With SECOND_PASS_FIX the answer
        of each turn stays internal and the final one is checked and streamed.
        A turn that calls a tool named in `stop_at` ends the loop at once, its
        calls unanswered: the caller answers them.
        """
        verify = self.ctx.policies.verify
        rounds = 0
        while True:
            final = max_rounds is not None and rounds >= max_rounds
            turn = await self.ask(tool_choice="none" if final else None, emit_content=not verify)
            if not turn.tool_calls:
                break
            if not stop_at.isdisjoint(call.name for call in turn.tool_calls):
                return turn
            if final:
                self.record(self._refuse_all(turn.tool_calls, NO_MORE_TOOLS))
                break
            await self.round(turn, one_tool=one_tool)
            rounds += 1
        if verify:
            turn = await second_pass(self.ctx, self.stage, self.messages)
            self.messages.append(assistant_message(turn))
        return turn


class _Streamed:
    """The model turn a conversation asks for, as its step runs it: `stream_turn` with what
    it needs. An object rather than a closure, whose cells the asking frame would hold too
    for as long as the turn streams."""

    __slots__ = ("client", "conversation", "emit_content", "request")

    def __init__(
        self,
        conversation: Conversation,
        client: ModelClient,
        request: ModelRequest,
        emit_content: bool,
    ) -> None:
        self.conversation = conversation
        self.client = client
        self.request = request
        self.emit_content = emit_content

    def __call__(self) -> Awaitable[TurnResult]:
        conversation = self.conversation
        ctx = conversation.ctx
        return stream_turn(
            ctx.run,
            ctx.out,
            ctx.ids,
            self.client,
            self.request,
            emit_content=self.emit_content,
            emit_reasoning=ctx.policies.stream_reasoning,
            tools=conversation.tools.by_name,
        )


async def finish(ctx: RunContext, stage: ResolvedStage, finish_reason: str) -> Outcome:
    """End a mode: the reasoning summary if the output policy asks for one, then the outcome."""
    if ctx.policies.summarize_reasoning:
        await summarize_reasoning(ctx, stage)
    return Outcome(finish_reason or "stop", ctx.policies.usage)
