"""Copy the web page's browser libraries into `service/gateway/static/vendor/` (`make vendor`).

The page vendors a few well-kept libraries instead of loading them from a CDN, so that
`make run` needs no network: marked (Markdown), DOMPurify (sanitising the HTML it makes)
and highlight.js (code). `scripts/vendor/package.json` pins them; `npm ci` there fetches
them from the npm registry, and this script copies each one's browser ES module and its
licence, and lists what it copied in `vendor/README.md`. The copies are committed.

    python scripts/vendor.py          # copy from scripts/vendor/node_modules
    python scripts/vendor.py --check  # exit 1 when the copies differ from node_modules
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ROOT / "scripts" / "vendor" / "node_modules"
VENDOR = ROOT / "service" / "gateway" / "static" / "vendor"

#: Package → (folder under vendor/, [(file in the package, file in the folder)]).
LIBRARIES = {
    "marked": ("marked", [("lib/marked.esm.js", "marked.esm.js"), ("LICENSE", "LICENSE")]),
    "dompurify": ("dompurify", [("dist/purify.es.mjs", "purify.es.mjs"), ("LICENSE", "LICENSE")]),
    "@highlightjs/cdn-assets": (
        "highlight",
        [("es/highlight.min.js", "highlight.min.js"), ("LICENSE", "LICENSE")],
    ),
}


def copies() -> dict[Path, bytes]:
    """Every vendored file and its content, as copied from node_modules."""
    files: dict[Path, bytes] = {}
    rows = ["| library | version | licence | files |", "|---|---|---|---|"]
    for package, (folder, pairs) in LIBRARIES.items():
        source = MODULES / package
        meta = json.loads((source / "package.json").read_text())
        for name, copy in pairs:
            files[VENDOR / folder / copy] = _without_source_map((source / name).read_bytes())
        listed = ", ".join(f"`{folder}/{copy}`" for _, copy in pairs)
        rows.append(f"| {package} | {meta['version']} | {meta['license']} | {listed} |")
    readme = (
        "# Vendored browser libraries\n\n"
        "Copied from the npm registry by `make vendor` (scripts/vendor.py, pinned in\n"
        "scripts/vendor/package.json); do not edit. Each keeps its own licence.\n\n"
        + "\n".join(rows)
        + "\n"
    )
    files[VENDOR / "README.md"] = readme.encode()
    return files


def _without_source_map(data: bytes) -> bytes:
    """The file without its `sourceMappingURL` comment (the map is not vendored)."""
    lines = data.split(b"\n")
    kept = [line for line in lines if not line.startswith(b"//# sourceMappingURL=")]
    return b"\n".join(kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of copying")
    args = parser.parse_args(argv)
    if not MODULES.is_dir():
        print("run `npm ci` in scripts/vendor first (make vendor does)", file=sys.stderr)
        return 2
    stale = []
    for path, data in copies().items():
        if args.check:
            if not path.exists() or path.read_bytes() != data:
                stale.append(str(path.relative_to(ROOT)))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if stale:
        print("stale vendored files (make vendor): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
