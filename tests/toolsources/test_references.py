"""Environment references, masking of their values, the URL shown, cuts and query values."""

from __future__ import annotations

import pytest

from service.toolsources.http import query_params
from service.toolsources.references import (
    Expanded,
    MissingVariable,
    cut,
    public_url,
    references,
)


def test_references_expand_and_their_values_are_masked_as_written_and_url_encoded() -> None:
    expanded = Expanded({"KEY": "a+b/c=secret", "USER": "bob"})
    assert expanded.text("Bearer ${ENV:KEY}") == "Bearer a+b/c=secret"
    assert expanded.mapping({"X-User": "${ENV:USER}", "Plain": "$ENV:KEY"}) == {
        "X-User": "bob",
        "Plain": "$ENV:KEY",
    }
    mask = expanded.mask()
    assert mask("sent a+b/c=secret and a%2Bb%2Fc%3Dsecret") == "sent *** and ***"
    assert mask("bob") == "bob"  # too short to be masked by value
    assert references("${ENV:A} ${ENV:B_2} ${ENV:} ${env:C}") == ["A", "B_2"]
    with pytest.raises(MissingVariable, match=r"^environment variable GONE is not set$"):
        expanded.text("${ENV:GONE}")


def test_the_url_shown_has_no_user_info_query_or_fragment() -> None:
    assert public_url("https://me:pw@api.example.com:8443/v1/x?key=1#top") == (
        "https://api.example.com:8443/v1/x"
    )
    assert public_url("http://[::1]/mcp?token=${ENV:T}") == "http://[::1]/mcp"
    assert public_url("http://[::1") == ""


def test_cut_keeps_whole_characters_and_says_how_much_there_was() -> None:
    assert cut("short", 10) == "short"
    assert cut("ééé", 5) == "éé\n[output cut: 6 bytes, the limit is 5]"


def test_arguments_become_query_parameters() -> None:
    assert query_params({"q": "a b", "n": 2, "ok": False, "none": None, "tags": ["x", 1]}) == [
        ("q", "a b"),
        ("n", "2"),
        ("ok", "false"),
        ("none", ""),
        ("tags", "x"),
        ("tags", "1"),
    ]
    assert query_params({"filter": {"city": "Paris"}}) == [("filter", '{"city":"Paris"}')]
