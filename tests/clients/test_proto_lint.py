"""The proto lint (`make lint-proto`): buf with the rules of buf.yaml, clean on proto/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "clients" / "node" / "node_modules" / ".bin" / "buf"

BAD_PROTO = """\
syntax = "proto3";

package agw;

// Documented.
enum Color {
  RED = 0;
  // Documented.
  COLOR_BLUE = 1;
}

message thing {
  // Documented.
  string itemName = 1;
}

service ThingGateway {
  rpc Get(thing) returns (thing);
}
"""


@pytest.fixture
def buf() -> Path:
    assert BUF.exists(), "buf comes with the Node client's packages: run `make install`"
    return BUF


def lint(buf: Path, workspace: Path) -> tuple[int, list[dict[str, str]]]:
    done = subprocess.run(
        [str(buf), "lint", "--error-format", "json"],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
    )
    issues = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, issues


def test_the_contract_is_lint_clean(buf: Path) -> None:
    code, issues = lint(buf, ROOT)
    assert (code, issues) == (0, [])


def test_the_rules_catch_naming_versions_zero_values_and_comments(
    buf: Path, tmp_path: Path
) -> None:
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    shutil.copytree(ROOT / "clients" / "node" / "googleapis", tmp_path / "clients/node/googleapis")
    (tmp_path / "proto" / "agw").mkdir(parents=True)
    (tmp_path / "proto" / "agw" / "bad.proto").write_text(BAD_PROTO)
    code, issues = lint(buf, tmp_path)
    assert code != 0
    rules = {issue["type"] for issue in issues}
    assert {
        "PACKAGE_VERSION_SUFFIX",  # versioned package
        "ENUM_ZERO_VALUE_SUFFIX",  # COLOR_UNSPECIFIED = 0
        "ENUM_VALUE_PREFIX",
        "MESSAGE_PASCAL_CASE",
        "FIELD_LOWER_SNAKE_CASE",
        "COMMENT_ENUM_VALUE",  # RED has no comment
        "COMMENT_MESSAGE",
        "COMMENT_SERVICE",
        "COMMENT_RPC",
    } <= rules, rules
