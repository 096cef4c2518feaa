"""How many tokens a text takes, estimated by script, with no tokenizer at run time.

A flat "4 characters a token" fits English prose, but a Chinese character is most of a
token by itself (~1.8 characters a token with OpenAI's o200k vocabulary, ~1.4 with
cl100k's), so Chinese prompts were under-counted 2-3 times and their context was
compressed too late. The text is counted by kind of character instead, each kind at
its own rate:

| kind | tokens each |
|---|---|
| CJK ideograph, kana, hangul, full-width form or punctuation | 0.8 |
| a run of ASCII letters (a word or identifier) | 0.75, plus 0.075 per letter |
| a digit | 0.65 |
| any other non-space character (ASCII punctuation, other scripts) | 0.7 |
| a space or line break | 0.02 |

The rates were fitted (least squares, then rounded) to the o200k_base counts of real
samples — Chinese paragraphs of the design documents agw was built from, English
paragraphs of the README, Python source of the service — and are checked against the
tokenizer in tests/core/run/test_tokens.py: the estimate is within ~10% of o200k on
each kind of text on average (Chinese slightly over: compressing a little early is the
safe side; cl100k counts Chinese ~25% higher still).
"""

from __future__ import annotations

import re

_WIDE = re.compile(
    "[\u1100-\u11ff\u2e80-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]"
)
_WORD = re.compile(r"[A-Za-z]+")
_DIGIT = re.compile(r"[0-9]")
_SPACE = re.compile(r"\s")

WIDE_RATE = 0.8
WORD_RATE = 0.75
LETTER_RATE = 0.075
DIGIT_RATE = 0.65
OTHER_RATE = 0.7
SPACE_RATE = 0.02
#: What a character costs at most (a one-letter word): `text_tokens(t) <= MAX_RATE * len(t)`.
MAX_RATE = max(WIDE_RATE, WORD_RATE + LETTER_RATE, DIGIT_RATE, OTHER_RATE, SPACE_RATE)


def text_tokens(text: str) -> float:
    """The estimated tokens of `text` (a fraction: add texts up, then round)."""
    if not text:
        return 0.0
    size = len(text)
    wide = size - len(_WIDE.sub("", text))
    letters = size - len(_WORD.sub("", text))
    words = len(_WORD.findall(text))
    digits = size - len(_DIGIT.sub("", text))
    spaces = size - len(_SPACE.sub("", text))
    other = size - wide - letters - digits - spaces
    return (
        wide * WIDE_RATE
        + words * WORD_RATE
        + letters * LETTER_RATE
        + digits * DIGIT_RATE
        + other * OTHER_RATE
        + spaces * SPACE_RATE
    )
