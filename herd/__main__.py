"""`python -m herd ...`: the same command line as `herd ...` (herd/cli.py)."""
from herd.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
