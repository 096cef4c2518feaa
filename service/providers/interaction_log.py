"""The interaction log: every model call, delta by delta, at DEBUG on "agw.llm" (SPEC §7).

`LoggedModel` wraps a `ModelClient` (as pydantic-ai's `InstrumentedModel` wraps a
model) and logs each call it opens: the request the provider reports sending (URL,
headers, body) and each retry before the first byte, both through the call's
observer (`service.providers.observer`); then each delta, and the end of the call
with the error that ended it, if any, which the wrapper sees itself.

Costs one `isEnabledFor` check per call when DEBUG is off: the wrapped client's
stream is then used as it is. With masking on, values of sensitive keys (headers
whose names look secret, and keys at any depth of the JSON body, including JSON
objects embedded in strings such as tool-call arguments) are replaced by "***",
and so is every occurrence of a secret the provider reports knowing (its
`SecretMask`), in every line.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from opentelemetry import trace

from service.core.masking import MASK, SecretMask, is_secret_header, is_sensitive, mask
from service.core.model import ModelClient, ModelDelta, ModelRequest
from service.providers.observer import observing

logger = logging.getLogger("agw.llm")


class LoggedModel:
    """A `ModelClient` logging every call of the client it wraps (`wrapped`)."""

    def __init__(self, wrapped: ModelClient, *, mask_sensitive: bool = True) -> None:
        self.wrapped = wrapped
        self.key = wrapped.key
        self.mask_sensitive = mask_sensitive

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelDelta]]:
        """The wrapped client's call, logged when DEBUG is enabled for agw.llm."""
        if not logger.isEnabledFor(logging.DEBUG):
            return self.wrapped.stream(request)
        return self._logged(request)

    async def aclose(self) -> None:
        await self.wrapped.aclose()

    @asynccontextmanager
    async def _logged(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelDelta]]:
        call = CallLog(self.key, request, mask_sensitive=self.mask_sensitive)
        try:
            async with AsyncExitStack() as stack:
                with observing(call):  # the provider reports the request and its retries
                    deltas = await stack.enter_async_context(self.wrapped.stream(request))
                relayed = _relay(deltas, call)
                stack.push_async_callback(relayed.aclose)
                yield relayed
        except BaseException as exc:
            call.end(exc)
            raise
        call.end()


async def _relay(
    deltas: AsyncIterator[ModelDelta], call: CallLog
) -> AsyncGenerator[ModelDelta, None]:
    async for delta in deltas:
        call.delta(delta)
        yield delta


class CallLog:
    """The log of one model call (only exists while DEBUG is enabled); its `CallObserver`."""

    __slots__ = (
        "_extra",
        "_mask_sensitive",
        "_prefix",
        "_scrub",
        "_started",
        "_tool_names",
        "deltas",
    )

    def __init__(self, provider: str, request: ModelRequest, *, mask_sensitive: bool) -> None:
        ctx = trace.get_current_span().get_span_context()
        trace_id = f"{ctx.trace_id:032x}" if ctx.is_valid else ""
        self._extra = {
            "provider": provider,
            "run_id": request.run_id,
            "stage": request.stage,
            "trace_id": trace_id,
        }
        self._prefix = (
            f"provider={provider} model={request.model} run_id={request.run_id} "
            f"stage={request.stage}" + (f" trace_id={trace_id}" if trace_id else "")
        )
        self._mask_sensitive = mask_sensitive
        self._scrub: SecretMask | None = None  # None: nothing to mask by value
        self._started = time.monotonic()
        self._tool_names: dict[int, str] = {}
        self.deltas = 0

    def log(self, msg: str, *args: Any) -> None:
        if self._scrub is None:
            logger.debug("%s " + msg, self._prefix, *args, extra=self._extra)
        else:
            text = self._scrub(msg % args)
            logger.debug("%s %s", self._prefix, text, extra=self._extra)

    def request(
        self, url: str, headers: Mapping[str, str], body: Mapping[str, Any], secrets: SecretMask
    ) -> None:
        if self._mask_sensitive:
            self._scrub = secrets or None
        hdrs: Any = dict(headers)
        shown: Any = body
        if self._mask_sensitive:
            hdrs = {
                k: MASK if is_sensitive(k) or is_secret_header(k) else v for k, v in hdrs.items()
            }
            shown = mask(body)
        self.log(
            "llm.request url=%s headers=%s body=%s",
            url,
            json.dumps(hdrs, ensure_ascii=False),
            json.dumps(shown, ensure_ascii=False, default=str),
        )

    def retry(self, attempt: int, delay: float, error: BaseException) -> None:
        self.log("llm.retry attempt=%d delay=%.3fs error=%s", attempt, delay, error)

    def delta(self, d: ModelDelta) -> None:
        self.deltas += 1
        parts: list[str] = []
        if d.reasoning is not None:
            parts.append(f"reasoning={d.reasoning!r}")
        if d.content is not None:
            parts.append(f"content={d.content!r}")
        for tc in d.tool_calls:
            if tc.name:
                self._tool_names[tc.index] = tc.name
            name = self._tool_names.get(tc.index, "")
            ident = f" id={tc.id}" if tc.id else ""
            parts.append(f"tool_call[{tc.index}]{ident} name={name} args={tc.arguments!r}")
        if d.finish_reason is not None:
            parts.append(f"finish_reason={d.finish_reason}")
        if d.usage is not None:
            u = d.usage
            parts.append(
                f"usage=prompt:{u.prompt_tokens},completion:{u.completion_tokens},"
                f"total:{u.total_tokens},reasoning:{u.reasoning_tokens},cached:{u.cached_tokens}"
            )
        self.log("llm.delta #%d %s", self.deltas, " ".join(parts))

    def end(self, error: BaseException | None = None) -> None:
        elapsed = time.monotonic() - self._started
        if error is None:
            self.log("llm.end deltas=%d elapsed=%.3fs", self.deltas, elapsed)
        else:
            kind = type(error).__name__
            self.log(
                "llm.end deltas=%d elapsed=%.3fs error=%s: %s", self.deltas, elapsed, kind, error
            )
