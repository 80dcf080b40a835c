"""`python -m gobrrr ...` (and `torchrun -m gobrrr train ...`) runs the CLI.

A rank of a multi-process run that fails leaves with `os._exit` once its output is flushed: its process group is
destroyed by then, and the interpreter's teardown of native objects (gloo's and the checkpoint reader's threads)
once aborted a rank that had already printed its error and was leaving with 2 (SIGABRT, 1 run in 24 on a loaded
CI machine), which the launcher then reports instead of the exit code."""
import os
import sys

from gobrrr.cli import main

if __name__ == "__main__":
    code = main()
    if code and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
