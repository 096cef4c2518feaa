"""The layering contracts hold: `lint-imports` passes on the contracts in pyproject.toml.

The contracts (`[tool.importlinter]`): the core imports no transport, server,
provider, tool or settings code; providers and built-in tools take plain
values, not the settings; the gRPC transport and the HTTP/SSE gateway are
independent; in the core only `events` and `history` import generated code; the
core's floors (wings and faces) import only downwards. And no two modules of the core
import each other, even through others or only for type checking.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = (  # `lint-imports --no-cache` with the interpreter running the tests
    "import sys\n"
    "from importlinter.cli import lint_imports\n"
    "sys.exit(lint_imports(no_cache=True, no_logo=True))\n"
)


def test_the_layering_contracts_hold() -> None:
    path = [str(ROOT), str(ROOT / "gen"), os.environ.get("PYTHONPATH", "")]
    result = subprocess.run(
        [sys.executable, "-c", LINT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert re.search(r"Contracts: 5 kept, 0 broken\.", report), report


def test_no_module_of_the_core_imports_itself_through_others() -> None:
    import grimp

    sys.path[:0] = [str(ROOT), str(ROOT / "gen")]
    graph = grimp.build_graph("service", cache_dir=None)
    core = {m for m in graph.modules if m == "service.core" or m.startswith("service.core.")}
    circles = []
    for importer in sorted(core):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & core):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                circles.append((importer, *back))
    assert circles == []
