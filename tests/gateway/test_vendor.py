"""The page's vendored browser libraries: each pinned, copied whole with its licence, and
every module the page imports is there (so `make run` needs no network)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "service" / "gateway" / "static"
VENDOR = STATIC / "vendor"
PINS = json.loads((ROOT / "scripts" / "vendor" / "package.json").read_text())["dependencies"]


def test_each_library_is_there_with_its_licence_and_pinned_version() -> None:
    listed = (VENDOR / "README.md").read_text()
    rows = dict(re.findall(r"^\| (\S+) \| (\S+) \|", listed, re.M)[1:])  # after the header
    assert rows == PINS  # what was copied is what package.json pins
    for folder in ("marked", "dompurify", "highlight"):
        assert (VENDOR / folder / "LICENSE").stat().st_size > 500, folder


def test_every_module_the_page_imports_is_served_from_the_page_s_own_files() -> None:
    imports = {
        (script, target)
        for script in STATIC.glob("*.js")
        for target in re.findall(r"^import .* from '([^']+)';$", script.read_text(), re.M)
    }
    assert {t for _, t in imports if "vendor" in t} == {
        "./vendor/dompurify/purify.es.mjs",
        "./vendor/highlight/highlight.min.js",
        "./vendor/marked/marked.esm.js",
    }
    for script, target in imports:
        assert target.startswith("./"), f"{script.name} imports {target} from elsewhere"
        assert (STATIC / target).is_file(), f"{script.name}: {target} is missing"


@pytest.mark.skipif(
    not (ROOT / "scripts" / "vendor" / "node_modules").is_dir(),
    reason="scripts/vendor/node_modules is installed by `make vendor` only",
)
def test_the_copies_match_the_installed_packages() -> None:
    check = [sys.executable, str(ROOT / "scripts" / "vendor.py"), "--check"]
    done = subprocess.run(check, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
