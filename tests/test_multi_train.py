"""multi_train.py's shipped experiments, checked as a run checks its options before it
starts (no process is started)."""
import json
import sys

from herd_testing import ROOT


def test_multi_train_experiments_are_valid_and_distinct():
    """The shipped EXPERIMENTS pass every check a run makes before it starts."""
    sys.path.insert(0, str(ROOT))
    try:
        import multi_train
    finally:
        sys.path.remove(str(ROOT))
    from herd.plan import prepare

    assert 2 <= len(multi_train.EXPERIMENTS) and all(isinstance(e, dict) for e in multi_train.EXPERIMENTS)
    assert len({json.dumps(e, sort_keys=True) for e in multi_train.EXPERIMENTS}) == len(multi_train.EXPERIMENTS)
    for experiment in multi_train.EXPERIMENTS:
        prepare({}, experiment)                            # raises ConfigError / EnvError if one is wrong
