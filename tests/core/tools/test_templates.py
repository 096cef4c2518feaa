"""Argument templates: fields of earlier results, chained, with date arithmetic."""

from __future__ import annotations

import pytest

from service.core.tools.templates import ResultMemory, TemplateError, has_templates, render


@pytest.fixture
def memory() -> ResultMemory:
    memory = ResultMemory()
    memory.record("city_datetime", {"date": "2025-02-27", "iso": "2025-02-27T23:30:00+08:00"})
    memory.record("search", '{"items": [{"url": "https://a"}], "count": 3}')  # JSON text
    memory.record("clock", {"utc": "2025-12-31T10:00:00Z"})
    return memory


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"date": "{{city_datetime.date}}"}, {"date": "2025-02-27"}),
        ({"date": "{{ city_datetime.date + 2d }}"}, {"date": "2025-03-01"}),
        ({"date": "{{city_datetime.date-30d}}"}, {"date": "2025-01-28"}),
        ({"when": "{{city_datetime.iso+1d}}"}, {"when": "2025-02-28T23:30:00+08:00"}),
        ({"when": "{{clock.utc+1d}}"}, {"when": "2026-01-01T10:00:00Z"}),
        ({"n": "{{search.count}}"}, {"n": 3}),  # a whole template keeps the value's type
        ({"q": "top {{search.count}} from {{search.items.0.url}}"}, {"q": "top 3 from https://a"}),
        ({"list": ["{{city_datetime.date+1d}}", 7]}, {"list": ["2025-02-28", 7]}),
        ({"plain": "no {templates} here"}, {"plain": "no {templates} here"}),
    ],
)
def test_render(memory: ResultMemory, arguments: dict, expected: dict) -> None:
    assert render(arguments, memory) == expected


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"d": "{{weather.date}}"}, "no earlier result of tool 'weather' in this run"),
        ({"d": "{{city_datetime.day}}"}, "the result of 'city_datetime' has no field 'day'"),
        ({"d": "{{search.items.5.url}}"}, "the result of 'search' has no field 'items.5'"),
        ({"d": "{{search.count+1d}}"}, "{{search.count+1d}}: 3 is not an ISO date or date-time"),
    ],
)
def test_unresolvable_templates_are_errors(
    memory: ResultMemory, arguments: dict, message: str
) -> None:
    with pytest.raises(TemplateError) as caught:
        render(arguments, memory)
    assert str(caught.value) == message


def test_the_latest_result_wins_and_detection() -> None:
    memory = ResultMemory()
    memory.record("t", {"v": 1})
    memory.record("t", {"v": 2})
    assert render("{{t.v}}", memory) == 2
    assert has_templates({"a": ["x", {"b": "{{t.v}}"}]})
    assert not has_templates({"a": ["x", 1, None]})
