"""The Ray backend's options and refusals, checked in-process (no cluster): each bad value
is one ConfigError line; an unreachable head is refused by a TCP probe within seconds."""
import socket
import sys
import time

import pytest

from herd.backends import backend_options, check_backend
from herd.backends import ray_cluster
from herd.backends.ray_cluster import check_ray_address
from herd.config import ConfigError, resolve
from herd.envs import env_kind


def checked(**options):
    cfg = resolve({"env": "CartPole-v1", **options}, env_kind=env_kind)
    cfg.validate()
    return cfg


@pytest.mark.parametrize("cpus", ["0.25", "1", "2"])
def test_actor_cpus_fractions_below_one_and_whole_numbers_above(cpus):
    assert checked(multiprocessing_backend="ray", actor_cpus=cpus).parallel.actor_cpus == float(cpus)


@pytest.mark.parametrize("options, words", [
    ({"actor_cpus": "0"}, "--actor_cpus must be > 0"),
    ({"actor_cpus": "-1"}, "--actor_cpus must be > 0"),
    ({"actor_cpus": "1.5"}, "a whole number above 1"),
    ({"ray_address": "headnode"}, "--ray_address must be local, auto or host:port"),
    ({"ray_address": "10.0.0.5:"}, "--ray_address must be"),
    ({"ray_address": "10.0.0.5:70000"}, "--ray_address must be"),
    ({"multiprocessing_backend": "ray", "learner_count": "2"}, "not built yet"),
    ({"multiprocessing_backend": "ray", "actor_inference": "server"}, "--actor_inference=local"),
    # The replay server (Ape-X on Ray): never silently the replay in the learner instead.
    ({"algorithm": "apex", "replay_server": "True"}, "needs --multiprocessing_backend=ray"),
    ({"multiprocessing_backend": "ray", "replay_server": "True"}, "built for --algorithm=apex only"),
    ({"algorithm": "apex", "multiprocessing_backend": "ray", "replay_server": "True",
      "replay_server_node": "10.0.0.5"}, "must be learner or a Ray node id"),
    ({"algorithm": "apex", "multiprocessing_backend": "ray", "replay_server_node": "ab" * 28},
     "--replay_server is off"),
])
def test_bad_ray_options_are_one_line(options, words):
    with pytest.raises(ConfigError) as err:
        checked(**options)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_addresses_that_name_a_cluster_pass_the_syntax_check():
    for address in ("local", "auto", "10.0.0.5:6379", "head.example.org:6379"):
        assert checked(ray_address=address).parallel.ray_address == address
    assert backend_options("ray", checked().parallel) == {"ray_address": "local", "actor_cpus": 1.0,
                                                          "replay_server": False, "replay_server_node": "learner",
                                                          "ray_compress_obs": False}
    node = "ab" * 28
    served = checked(algorithm="apex", multiprocessing_backend="ray", replay_server="True", replay_server_node=node)
    assert backend_options("ray", served.parallel)["replay_server_node"] == node
    assert backend_options("python_native", checked().parallel) == {}


def test_without_ray_the_backend_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` now fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        check_backend("ray")
    check_backend("python_native")                       # the local backend needs nothing more


def test_the_address_probe_refuses_what_is_no_ray_head_within_seconds(monkeypatch):
    # The probe's deadline (5 s) made short: what is checked is that a silent port is
    # refused at the deadline, not after Ray's own ~20 s of retries.
    monkeypatch.setattr(ray_cluster, "PROBE_TIMEOUT", 2.0)
    PROBE_TIMEOUT = ray_cluster.PROBE_TIMEOUT
    with socket.socket() as server:          # accepts TCP connections, but speaks no gRPC: not a Ray head
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ConfigError, match="cannot reach a Ray head.*no answer within 2 s"):
            check_ray_address(f"127.0.0.1:{port}")
        assert time.monotonic() - started < PROBE_TIMEOUT + 2
    started = time.monotonic()
    with pytest.raises(ConfigError, match="nothing listens there"):
        check_ray_address(f"127.0.0.1:{port}")           # closed now: refused at once
    assert time.monotonic() - started < PROBE_TIMEOUT
