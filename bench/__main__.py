"""`python -m bench`: baselines and the gateway measured in one run (`--help` for the sizes).

Prints the report in Markdown and writes the figures as JSON to
`bench/results/latest.json` (and the Markdown next to it), or to `--out`. This
process (the load client) and every process it starts run on the event loop
`AGW_EVENT_LOOP` names, as the service does (uvloop's by default, where available).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench import report
from bench.options import Options, parse
from bench.suite import run_suite
from service.process import eventloop


async def run(options: Options) -> dict[str, Any]:
    """Run the benchmark; write and return the results document."""
    results = report.build(await run_suite(options))
    results["markdown"] = report.markdown(results)
    if options.out is not None:
        write(results, options.out)
    return results


def write(results: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    out.with_suffix(".md").write_text(results["markdown"] + "\n")


def main(argv: list[str] | None = None) -> None:
    results = eventloop.run(run(parse(argv)), os.environ.get("AGW_EVENT_LOOP", "auto"))
    print(results["markdown"])


if __name__ == "__main__":
    main()
