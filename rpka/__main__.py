"""Command line: ``python -m rpka {scaling,...} [options]``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

COMMANDS = {
    "bench": ("rpka.bench", "benchmark (--track forecast|lm): lr sweep, seeds, bench_report.json"),
    "longctx": ("rpka.longctx", "long-context training: exact vs rpka at contexts 512 and 2,048"),
    "report": ("rpka.pipeline", "run the study and render the HTML report"),
    "scaling": ("rpka.scaling", "attention latency against length and rank"),
    "decode": ("rpka.decoding", "per-token decoding latency against context length"),
    "summary": ("rpka.summary", "the study's results in Markdown (the README's results block)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: python -m rpka COMMAND [options]\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    module = __import__(COMMANDS[argv[0]][0], fromlist=["main"])
    module.main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
