"""The interaction log: every model call, delta by delta, at DEBUG on "agw.llm" (SPEC §7).

Costs one `isEnabledFor` check per call when DEBUG is off: `InteractionLog.begin`
then returns None and the caller skips every per-delta hook. With masking on,
values of sensitive keys (headers whose names look secret, and keys at any depth
of the JSON body, including JSON objects embedded in strings such as tool-call
arguments) are replaced by "***", and so is every occurrence of a secret the
provider's client knows (its `SecretMask`), in every line.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace

from service.core.masking import MASK, SecretMask, is_secret_header, is_sensitive, mask
from service.core.model import ModelDelta, ModelRequest

__all__ = ["MASK", "InteractionLog", "is_sensitive", "mask"]

logger = logging.getLogger("agw.llm")


class InteractionLog:
    """Per-provider switchboard; `begin` returns a `CallLog` only when logging is on."""

    __slots__ = ("enabled", "mask_sensitive", "provider", "secrets")

    def __init__(
        self,
        provider: str,
        *,
        enabled: bool = True,
        mask_sensitive: bool = True,
        secrets: SecretMask | None = None,
    ):
        self.provider = provider
        self.enabled = enabled
        self.mask_sensitive = mask_sensitive
        self.secrets = secrets if secrets is not None else SecretMask()

    def begin(
        self, request: ModelRequest, url: str, headers: Mapping[str, str], body: dict[str, Any]
    ) -> CallLog | None:
        """Log the request; None when the log is off or DEBUG is not enabled for agw.llm."""
        if not self.enabled or not logger.isEnabledFor(logging.DEBUG):
            return None
        scrub = self.secrets if self.mask_sensitive else None
        call = CallLog(self.provider, request, scrub)
        hdrs: Any = dict(headers)
        shown: Any = body
        if self.mask_sensitive:
            hdrs = {
                k: MASK if is_sensitive(k) or is_secret_header(k) else v for k, v in hdrs.items()
            }
            shown = mask(body)
        call.log(
            "llm.request url=%s headers=%s body=%s",
            url,
            json.dumps(hdrs, ensure_ascii=False),
            json.dumps(shown, ensure_ascii=False, default=str),
        )
        return call


class CallLog:
    """The log of one model call (only exists while DEBUG is enabled)."""

    __slots__ = ("_extra", "_prefix", "_scrub", "_started", "_tool_names", "deltas")

    def __init__(
        self, provider: str, request: ModelRequest, scrub: SecretMask | None = None
    ) -> None:
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
        self._scrub = scrub or None  # None: nothing to mask by value
        self._started = time.monotonic()
        self._tool_names: dict[int, str] = {}
        self.deltas = 0

    def log(self, msg: str, *args: Any) -> None:
        if self._scrub is None:
            logger.debug("%s " + msg, self._prefix, *args, extra=self._extra)
        else:
            text = self._scrub(msg % args)
            logger.debug("%s %s", self._prefix, text, extra=self._extra)

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
