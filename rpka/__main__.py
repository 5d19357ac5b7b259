"""``python -m rpka COMMAND [options]``: see ``rpka.cli.commands``."""

import os
import sys

# c10 logs "Memory block of unknown size was allocated before the profiling started" each
# time a profiled training step frees a tensor made before it (the long-context memory
# probe, rpka.speed.scaling.peak_memory_mib): harmless for the peak measured, noise in a log.
# c10 reads its log level once, when torch loads, so it is set before any import of torch;
# workers and notebook kernels inherit it, and a level the user set wins.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

# jsonschema (under nbformat, which the report's driver loads) imports the optional IRI
# checker `rfc3987_syntax` when it is installed (jupyterlab's jupyter-events asks for it); it
# compiles a Lark grammar at import: ~2 s of every command's start, for a format no notebook
# schema uses. Marked absent in this process only (jsonschema then skips that one checker).
sys.modules.setdefault("rfc3987_syntax", None)

from rpka import numerics  # noqa: E402  (after the log level)

try:  # the study's entry point pins the CPU numerics before anything loads torch
    numerics.pin()
except ValueError as err:  # a bad RPKA_NUMERICS: one line, exit 2, as every command refuses
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)

from rpka.cli.commands import main  # noqa: E402  (after pinning)

if __name__ == "__main__":
    sys.exit(main())
