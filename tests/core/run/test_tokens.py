"""The token estimate against a real tokenizer, on real Chinese, English and code.

`bpe-openai` (a development dependency) ships OpenAI's o200k_base and cl100k_base
vocabularies inside its wheel, so the counts need nothing downloaded. The samples: Chinese
paragraphs of the design documents agw was built from (tests/core/run/data/chinese.txt,
the users' own language), the English prose of the README and docs/, the service's own
Python source.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.run.tokens import MAX_RATE, text_tokens
from service.core.run.transcript import estimate_tokens, tokens_at_most

ROOT = Path(__file__).resolve().parents[3]
with warnings.catch_warnings():  # it reads its vocabularies with a deprecated importlib call
    warnings.simplefilter("ignore", DeprecationWarning)
    import bpe_openai

    O200K = bpe_openai.get_encoding("o200k_base")
    CL100K = bpe_openai.get_encoding("cl100k_base")


def chinese() -> list[str]:
    text = (Path(__file__).parent / "data" / "chinese.txt").read_text()
    return [part.strip() for part in text.split("\f") if part.strip()]


def english() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    paragraphs = [p for page in pages for p in page.read_text().split("\n\n")]
    prose = [p for p in paragraphs if len(p) > 300 and "|" not in p and "```" not in p]
    return [p for p in prose if not p.startswith("#")][:40]


def code() -> list[str]:
    files = sorted((ROOT / "service" / "core").rglob("*.py"))
    return [text[:3000] for f in files if len(text := f.read_text()) > 2000][:30]


SAMPLES = {"chinese": chinese, "english": english, "code": code}


@pytest.mark.parametrize("kind", SAMPLES)
def test_the_estimate_is_within_a_tenth_of_o200k_on_each_kind_of_text(kind: str) -> None:
    samples = SAMPLES[kind]()
    assert len(samples) >= 10
    real = [len(O200K.encode(text)) for text in samples]
    estimated = [text_tokens(text) for text in samples]
    assert 0.9 <= sum(estimated) / sum(real) <= 1.1, (sum(estimated), sum(real))
    for text, count, guess in zip(samples, real, estimated, strict=True):
        assert 0.8 <= guess / count <= 1.25, (text[:80], guess, count)


def test_chinese_is_no_longer_counted_at_four_characters_a_token() -> None:
    """The flat rate counted Chinese at under half its tokens: compression came too late."""
    samples = chinese()
    characters = sum(len(text) for text in samples)
    real = sum(len(O200K.encode(text)) for text in samples)
    assert characters / 4 < 0.5 * real  # what the flat rate did
    assert sum(text_tokens(text) for text in samples) >= real  # never under o200k's count
    # cl100k (GPT-4, GPT-3.5) counts Chinese higher still: the estimate sits between the two
    assert sum(text_tokens(text) for text in samples) < sum(len(CL100K.encode(t)) for t in samples)


def test_a_prompt_is_estimated_by_its_messages_texts() -> None:
    question = "请帮我总结一下这份关于智能体网关架构的设计文档。"
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": question},
    ]
    real = len(O200K.encode("You are helpful.")) + len(O200K.encode(question))
    estimate = estimate_tokens(messages)
    assert real <= estimate <= real + 2 * 4 + 4  # the texts, and a little for each message
    assert estimate_tokens([]) == 0
    assert text_tokens("") == 0.0


@given(
    st.lists(
        st.tuples(
            st.text(st.characters(codec="utf-8")),
            st.one_of(st.none(), st.lists(st.dictionaries(st.text(), st.text()), max_size=2)),
        ),
        max_size=5,
    )
)
@settings(max_examples=300, deadline=None)
def test_the_length_bound_is_never_under_the_estimate(texts: list[tuple[str, Any]]) -> None:
    """What lets a prompt far from the limits skip the estimate (`ContextWindow.fit`)."""
    messages = [{"role": "user", "content": text, "tool_calls": calls} for text, calls in texts]
    assert estimate_tokens(messages) <= tokens_at_most(messages)
    for text, _ in texts:
        assert text_tokens(text) <= MAX_RATE * len(text)
