"""Does importing the library change a user's numerics or speed? (issue 52)

Times a float32 matmul (2,048 x 2,048, one thread, CPU time, median of repeats) in fresh
processes that import nothing of rpka, that import ``rpka.swap`` first, and that pin the
study's numerics (``rpka.numerics.pin()``), interleaved; writes the JSON given by --out.

    python scripts/bench_import_numerics.py --out data/results/full/import_numerics.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rpka.io import write_result_json

SIZE = 2048
PREFIXES = {
    "no rpka": "",
    "import rpka.swap": "import rpka.swap;",
    "rpka.numerics.pin()": "from rpka import numerics; numerics.pin();",
}
PROBE = (
    "import json, os, time, torch; torch.set_num_threads(1);"
    f"a = torch.randn({SIZE}, {SIZE}); b = torch.randn({SIZE}, {SIZE}); a @ b;"
    "t = []\nfor _ in range({repeats}):\n s = time.process_time(); a @ b;"
    " t.append(time.process_time() - s)\n"
    "print(json.dumps({{'ms': sorted(t)[len(t) // 2] * 1e3,"
    " 'capability': torch.backends.cpu.get_cpu_capability(),"
    " 'MKL_CBWR': os.environ.get('MKL_CBWR')}}))"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, >= 1")
    parser.add_argument("--repeats", type=int, default=7, help="matmuls per process, >= 3")
    args = parser.parse_args()
    if args.rounds < 1 or args.repeats < 3:
        parser.error("--rounds must be >= 1 and --repeats >= 3")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                        "NUMBA_CPU_NAME", "OMP_NUM_THREADS")}  # fmt: skip
    rows: dict[str, list[dict]] = {name: [] for name in PREFIXES}
    for _ in range(args.rounds):
        for name, prefix in PREFIXES.items():
            code = prefix + PROBE.replace("{repeats}", str(args.repeats)).replace("{{", "{")
            code = code.replace("}}", "}")
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True).stdout  # fmt: skip
            rows[name].append(json.loads(out))
    from rpka import numerics  # after the probes: this process's own state does not matter

    result = {
        "what": f"float32 matmul {SIZE}x{SIZE}, one thread, CPU ms, median per process",
        "cpu_vendor": numerics.cpu_vendor(),
        "cpu_model": numerics.cpu_model(),
        "rounds": rows,
        # the fastest process of each kind: the one least disturbed by other load
        "fastest_ms": {name: min(r["ms"] for r in runs) for name, runs in rows.items()},
    }
    write_result_json(args.out, result)
    print(json.dumps(result["fastest_ms"]), f"-> {args.out}")


if __name__ == "__main__":
    main()
