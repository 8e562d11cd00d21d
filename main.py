"""The seed's entry point: `python main.py --op_mode=train|train_w_load|test --env=... ...`."""
import sys

from herd.cli import seed_main

if __name__ == "__main__":
    sys.exit(seed_main())
