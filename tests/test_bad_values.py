"""Values that passed validation and then crashed after a run folder was made: each is
now refused by validate() with one line naming the option (no process, nothing written)."""
import pytest

from herd_testing import kind_of
from herd.config import ConfigError, resolve
from herd.validation import max_worker_count
from herd.plan import check_results_dir


def validated(**options):
    cfg = resolve({"env": "CartPole-v1", **options}, env_kind=kind_of)
    cfg.validate()
    return cfg


@pytest.mark.parametrize("options, words", [
    ({"lr": "nan"}, "--lr must be a finite number"),
    ({"lr": "inf"}, "--lr must be a finite number"),
    ({"lr": "1e39"}, "beyond float32"),
    ({"lr_end_value": "nan"}, "--lr_end_value must be a finite number"),
    ({"gradient_clip_by_norm_threshold": "nan"}, "finite"),
    ({"seed": "-5"}, "--seed must be an integer from 0"),
    ({"seed": str(2**40)}, "--seed must be an integer from 0"),
    ({"actor_timeout": "0"}, "--actor_timeout must be >= 2"),
    ({"actor_timeout": "-1", "max_actor_restarts": "-1"}, "--actor_timeout"),
    ({"max_actor_restarts": "-1"}, "--max_actor_restarts must be >= 0"),
    ({"actor_timeout": "inf"}, "finite"),
    ({"worker_count": "1000"}, "--worker_count=1000 is more actor processes"),
    ({"results_dir": ""}, "--results_dir is empty"),
    ({"results_dir": "  "}, "--results_dir is empty"),
    ({"save_model_seconds": "0"}, "--save_model_seconds must be a number of seconds > 0"),
    ({"save_model_seconds": "-3"}, "--save_model_seconds must be a number of seconds > 0"),
    ({"save_model_seconds": "inf"}, "finite"),
])
def test_bad_value_is_one_line(options, words):
    with pytest.raises(ConfigError) as caught:
        validated(**options)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_the_values_next_to_the_bounds_are_accepted():
    cfg = validated(seed="0", actor_timeout="2", max_actor_restarts="0", worker_count=str(max_worker_count()),
                    lr="0.5")
    assert cfg.general.seed == 0 and cfg.parallel.worker_count == max_worker_count()
    assert validated(seed=str(2**32 - 1)).general.seed == 2**32 - 1


def test_worker_bound_follows_cores_and_memory(monkeypatch):
    import psutil
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert max_worker_count() <= 32
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"total": 3 * 300 * 2**20})())
    assert max_worker_count() == 3


def test_results_dir_that_is_a_file_or_under_one_is_refused(tmp_path):
    file = tmp_path / "a_file"
    file.write_text("x")
    for path, words in ((file, "is a file"), (file / "results", "which is a file")):
        with pytest.raises(ConfigError, match=words):
            check_results_dir(str(path))
    check_results_dir(str(tmp_path / "new" / "deeper"))     # to be made: fine
    assert not (tmp_path / "new").exists()                  # and nothing was made


def test_results_dir_that_is_not_writable_is_refused(tmp_path, monkeypatch):
    # Tests run as root, whom permissions do not stop: the check's own question is faked.
    monkeypatch.setattr("herd.plan.os.access", lambda path, mode: False)
    with pytest.raises(ConfigError, match="is not writable"):
        check_results_dir(str(tmp_path / "results"))
