"""`python -m gobrrr ...` (and `torchrun -m gobrrr train ...`) runs the CLI."""
from gobrrr.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
