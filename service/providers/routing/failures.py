"""Which failures of a deployment move an alias's call to its next deployment.

Before the call's first delta, a call moves on when the failure is the deployment's:
it could not be reached or did not answer in time, it streamed an error or a broken
answer, it rate-limited the call (429), failed (5xx), refused the key (401, 403) or
the model (404, or a 400 naming the model). A prompt too long for its context window
moves the call to a deployment with a longer one, without cooling this one down. Any
other refusal (a 400 about the request) or a prompt the provider blocked would fail on
every deployment: the call fails at once.
"""

from __future__ import annotations

import re
from enum import Enum

from service.core.errors import ProviderError, ProviderStreamError, ProviderTimeout
from service.providers.gemini_wire import PromptBlocked
from service.providers.http import RefusedCall


class Failure(Enum):
    """A failure that moves a call on, by what it says of the deployment."""

    UNAVAILABLE = "unavailable"  # unreachable, time-out, 5xx, broken stream
    RATE_LIMITED = "rate_limited"  # 429
    REFUSED = "refused"  # key or model refused
    CONTEXT = "context_length"  # the prompt is too long for its context window
    LIMITED = "limit_reached"  # its own rpm/tpm limit (no upstream call was made)


CONTEXT_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
_CONTEXT = re.compile(
    r"context[ _](length|window)|maximum context|prompt is too long|too many tokens"
    r"|input token count|exceeds the maximum number of tokens|reduce the length",
    re.I,
)
MODEL_CODES = frozenset({"model_not_found", "not_found_error", "NOT_FOUND"})
_MODEL = re.compile(
    r"\bmodel\b.*\b(not found|does not exist|not supported|unsupported|unknown|invalid|"
    r"no access|not available|decommissioned|deprecated)",
    re.I,
)


def classify(error: BaseException) -> Failure | None:
    """The failure `error` is, if it moves a call on (None: it fails the call)."""
    if isinstance(error, LimitReached):
        return Failure.LIMITED
    if not isinstance(error, ProviderError) or isinstance(error, PromptBlocked):
        return None
    if isinstance(error, ProviderTimeout | ProviderStreamError):
        return Failure.UNAVAILABLE
    status = error.status
    if status is None or status == 200:  # unreachable, cut, or not a stream of this API
        return Failure.UNAVAILABLE
    code = error.code if isinstance(error, RefusedCall) else ""
    if status in (400, 413, 422) and (code in CONTEXT_CODES or _CONTEXT.search(error.message)):
        return Failure.CONTEXT
    if status == 429:
        return Failure.RATE_LIMITED
    if status >= 500:
        return Failure.UNAVAILABLE
    if status in (401, 403, 404):
        return Failure.REFUSED
    if status == 400 and (code in MODEL_CODES or _MODEL.search(error.message)):
        return Failure.REFUSED
    return None


class LimitReached(ProviderError):
    """A deployment is at its own rate limit (rpm or tpm): skipped without a call."""

    def __init__(self, deployment: str, provider: str, limit: str, value: int) -> None:
        what = "calls" if limit == "rpm" else "tokens"
        super().__init__(
            provider, f"deployment {deployment!r} is at its limit of {value} {what} a minute"
        )
        self.limit = limit
