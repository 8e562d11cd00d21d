"""Several experiments in sequence, each with its own overridden options and run folder
(the seed's multi_train.py). Edit EXPERIMENTS, then: python multi_train.py [--flag=value ...]

Precedence: flags given here on the command line win over an experiment's overrides,
which win over a resumed checkpoint's config and the defaults. A failing experiment is
logged and the rest go on; the exit code is 1 if any failed. Ctrl+C stops the running
experiment cleanly (checkpoint and summary saved) and the sequence with it (exit code 130).
`herd multi FILE` does the same with experiments in a JSON or YAML file."""
import sys

from herd.cli import parse_seed_args, report_error, stop_handling
from herd.errors import ConfigError

EXPERIMENTS = [
    {"env": "CartPole-v1", "lr": 0.001},
    {"env": "CartPole-v1", "lr": 0.0005},
    {"env": "CartPole-v1", "replay_parameters":
        '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "standard", "capacity": 500, "sample_ratio": 0.5}]'},
]


def main(argv=None) -> int:
    with stop_handling():   # before the slow imports: a stop at any instant is handled
        from herd.run import run_multi
        argv = sys.argv[1:] if argv is None else argv
        try:
            command_line = parse_seed_args(argv)
        except ConfigError as err:
            return report_error(err)
        return run_multi(EXPERIMENTS, command_line, ["multi_train.py", *argv])


if __name__ == "__main__":
    sys.exit(main())
