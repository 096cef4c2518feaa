"""Following one run at the terminal: render it, answer what waits for the user, cancel on Ctrl-C.

What waits for the user, and the payload `Submit` then carries:

* a frontend tool (`tool.end` of a tool whose type is a view, not "backend"):
  an option's number, a JSON value, or text (see `agw_client.cli.frontend`);
  an empty line asks again;
* `question.ask`: the option chosen (by number or label), with `multiSelect` the
  list of those chosen (numbers or labels separated by commas), or the user's own
  words where the question allows them (no options, or `allowFreeText`); an
  answer that is none of these is asked again;
* `permission.ask` and `plan.approval`: true for y/yes, false otherwise.

End of input (Ctrl-D, or a closed pipe) leaves the wait unanswered; the run's
own time-out then applies. The first Ctrl-C asks the gateway to cancel the run
(`Cancel`) and follows the stream to its `run.cancel`, showing nothing more of it but
its end (what was on its way is not printed after "cancelling…"); a second one leaves
at once. On a terminal a spinner turns until the run shows something.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from agw_client.cli import frontend
from agw_client.cli.render import Renderer, ToolCall, short
from agw_client.errors import RpcError
from agw_client.fold import RunResult
from agw_client.messages import event_to_dict
from agw_client.sync import Client, QueryStream

BACKEND_TYPES = frozenset({"", "backend"})
TERMINAL = frozenset({"run_complete", "run_error", "run_cancel"})
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130

Reader = Callable[[str], str]


class Prompter:
    """Asks the user questions on the terminal; None when the input has ended."""

    def __init__(self, renderer: Renderer, read: Reader = input, *, echo: bool = False) -> None:
        self.renderer = renderer
        self._read = read
        #: Repeat the answer on the output, for input that the terminal does not echo (a pipe).
        self.echo = echo
        self.closed = False

    def ask(self, prompt: str) -> str | None:
        if self.closed:
            return None
        self.renderer.stop_spinner()
        self.renderer.end_line()
        self.renderer.prompted()
        try:
            answer = self._read(prompt)
        except EOFError:
            self.closed = True
            self.renderer.write("\n")
            return None
        if self.echo:
            self.renderer.write(answer + "\n")
        self.renderer.typed_line()
        return answer

    def confirm(self, prompt: str) -> bool | None:
        answer = self.ask(f"{prompt} [y/N] ")
        return None if answer is None else answer.strip().lower() in ("y", "yes")


def question_answer(ask: pb.QuestionAsk, text: str) -> Any:
    """The answer `text` gives to `ask` (a label, a list of labels, or free words); None
    when it is not one the question accepts."""
    free = ask.allow_free_text or not ask.options
    by_label = {option.casefold(): option for option in ask.options}

    def one(part: str) -> str | None:
        if part.isdigit() and 1 <= int(part) <= len(ask.options):
            return ask.options[int(part) - 1]
        return by_label.get(part.casefold()) or (part if free and part else None)

    if not ask.multi_select:
        return one(text.strip())
    chosen: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        answer = one(part)
        if answer is None:
            return None
        if answer not in chosen:
            chosen.append(answer)
    return chosen


def parse_answer(text: str) -> Any:
    """A typed answer: JSON when it parses as JSON, else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class Interrupts:
    """Ctrl-C while a run is followed: the first calls `on_first`, the second leaves.

    Outside a prompt the first Ctrl-C does not raise, so the stream is never
    interrupted mid-read; at a prompt it raises KeyboardInterrupt to end the prompt.
    """

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.on_first = on_first
        self.count = 0
        self._prompting = False
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():  # signals reach it alone
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    @contextmanager
    def prompting(self) -> Iterator[None]:
        self._prompting = True
        try:
            yield
        finally:
            self._prompting = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.on_first()
        if self.count > 1 or self._prompting:
            raise KeyboardInterrupt


class Session:
    """Runs streams against one client, rendering them (or printing JSON lines)."""

    def __init__(
        self,
        client: Client,
        renderer: Renderer,
        prompter: Prompter | None,
        *,
        json_lines: bool = False,
    ) -> None:
        self.client = client
        self.renderer = renderer
        self.prompter = prompter
        self.json_lines = json_lines
        self._interrupts = Interrupts(lambda: None)
        self._cancel_sent = False

    def follow(self, stream: QueryStream) -> RunResult:
        """Follow `stream` to its end; a second Ctrl-C raises KeyboardInterrupt."""
        interrupts = Interrupts(lambda: self._interrupted(stream))
        self._interrupts, self._cancel_sent = interrupts, False
        if not self.json_lines:
            self.renderer.wait()
        try:
            with stream, interrupts:
                for event in stream:
                    if interrupts.count and not self._cancel_sent:  # the run id is known now
                        self._start_cancel(stream)
                    if not interrupts.count or event.WhichOneof("payload") in TERMINAL:
                        self._show(event)  # once cancelling, nothing but the run's end
                    if not interrupts.count:
                        self._answer(stream, event)
                return stream.folder.result
        finally:
            self.renderer.stop_spinner()

    @staticmethod
    def exit_code(result: RunResult) -> int:
        if result.outcome == "complete":
            return EXIT_OK
        return EXIT_INTERRUPTED if result.outcome == "cancel" else EXIT_FAILED

    def _show(self, event: pb.Event) -> None:
        if self.json_lines:
            self.renderer.write(json.dumps(event_to_dict(event), ensure_ascii=False) + "\n")
        else:
            self.renderer.event(event)

    def _interrupted(self, stream: QueryStream) -> None:
        """The first Ctrl-C: cancel the run (in the background; its events keep coming)."""
        self.renderer.notice("cancelling… (Ctrl-C again to leave at once)")
        if stream.run_id:
            self._start_cancel(stream)

    def _start_cancel(self, stream: QueryStream) -> None:
        self._cancel_sent = True
        threading.Thread(target=self._cancel, args=(stream,), daemon=True).start()

    def _cancel(self, stream: QueryStream) -> None:
        try:
            stream.cancel()
        except RpcError as error:  # the run may have ended meanwhile
            self.renderer.notice(f"cancel: {error}")

    def _answer(self, stream: QueryStream, event: pb.Event) -> None:
        """Prompt for and submit the answer to whatever `event` says waits for the user."""
        if self.prompter is None:
            return
        try:
            with self._interrupts.prompting():
                wait = self._wait_answer(event)
        except KeyboardInterrupt:
            if self._interrupts.count > 1:
                raise
            return  # the first Ctrl-C at a prompt cancels the run: no answer
        if wait is None or wait[1] is None:
            return
        tool_id, payload = wait
        response = self.client.submit(
            stream.run_id, tool_id, payload, chat_id=stream.chat_id or event.chat_id
        )
        if not response.accepted:
            outcome = gw.SubmitOutcome.Name(response.outcome).removeprefix("SUBMIT_OUTCOME_")
            self.renderer.notice(f"not accepted: {outcome} {response.detail}".rstrip())

    def _wait_answer(self, event: pb.Event) -> tuple[str, Any] | None:
        """(id to answer, payload or None) when `event` waits for the user, else None."""
        assert self.prompter is not None
        kind = event.WhichOneof("payload")
        wait: tuple[str, Any] | None = None
        if kind == "tool_end":
            call = self.renderer.tool(event.tool_end.tool_id)
            if call.type not in BACKEND_TYPES:
                wait = (event.tool_end.tool_id, self._frontend(call))
        elif kind == "question_ask":
            wait = (event.question_ask.question_id, self._question(event.question_ask))
        elif kind == "permission_ask":
            ask = event.permission_ask
            allow = self.prompter.confirm(f"allow {ask.tool_name} {short(ask.arguments, 80)}?")
            wait = (ask.permission_id, allow)
        elif kind == "plan_approval":
            approval = event.plan_approval
            for text in self.renderer.plan_lines(approval.plan):
                self.renderer.line(text)
            wait = (approval.approval_id, self.prompter.confirm("approve this plan?"))
        return wait

    def _frontend(self, call: ToolCall) -> Any:
        """The answer to a waiting frontend tool, or None when the input ended."""
        assert self.prompter is not None
        title, *details = frontend.describe(call)
        self.renderer.line(self.renderer.style.bold(title))
        for line in details:
            self.renderer.line(line)
        while (text := self.prompter.ask("your answer: ")) is not None:
            if text.strip():
                options = frontend.options_of(frontend.arguments_of(call))
                return frontend.answer_of(text, options, call.answer_schema)
        return None

    def _question(self, ask: pb.QuestionAsk) -> Any:
        assert self.prompter is not None
        style = self.renderer.style
        self.renderer.line(style.bold(f"? {ask.question}"))
        described = {choice.label: choice for choice in ask.choices}
        for number, option in enumerate(ask.options, 1):
            choice = described.get(option)
            line = f"  {number}. {option}"
            if choice is not None and choice.recommended:
                line += " " + style.cyan("(recommended)")
            if choice is not None and choice.description:
                line += style.dim(f" — {choice.description}")
            self.renderer.line(line)
        own_words = ", or your own words" if ask.allow_free_text and ask.options else ""
        if ask.multi_select:
            prompt = f"your choices (numbers or labels, separated by commas{own_words}): "
        else:
            prompt = f"your answer (a number{own_words}): " if own_words else "your answer: "
        while True:
            text = self.prompter.ask(prompt)
            if text is None:
                return None
            answer = question_answer(ask, text)
            if answer is not None:
                return answer
            self.renderer.notice("choose by the number or the label of an option")
