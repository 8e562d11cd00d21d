"""The Ray backend's options and refusals, checked in-process (no cluster): each bad value
is one ConfigError line; an unreachable head is refused by a TCP probe within seconds."""
import socket
import sys

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
    ({"multiprocessing_backend": "ray", "actor_inference": "in_actor"}, "--actor_inference=in_actor shares memory"),
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
    assert backend_options("python_native", checked().parallel) == {"synchronous_sampling": False}


def test_without_ray_the_backend_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` now fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        check_backend("ray")
    check_backend("python_native")                       # the local backend needs nothing more


def test_the_address_probe_refuses_what_is_no_ray_head_within_seconds(monkeypatch):
    # The probe's deadline (5 s) made short: what is checked is that a silent port is
    # refused at the deadline, not after Ray's own ~20 s of retries.
    monkeypatch.setattr(ray_cluster, "PROBE_TIMEOUT", 2.0)
    with socket.socket() as server:          # accepts TCP connections, but speaks no gRPC: not a Ray head
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        # The message names the probe's own deadline: refused by it, not by Ray's retries.
        with pytest.raises(ConfigError, match="cannot reach a Ray head.*no answer within 2 s"):
            check_ray_address(f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="nothing listens there"):
        check_ray_address(f"127.0.0.1:{port}")           # closed now: refused at once


# What ray.nodes() answers for a cluster of a head with no CPUs, two workers of 2 and 4
# CPUs, and a dead node that had 16 (its CPUs are no room).
NODES = [{"NodeID": "head", "Alive": True, "Resources": {"memory": 1.0}},
         {"NodeID": "small", "Alive": True, "Resources": {"CPU": 2.0}},
         {"NodeID": "large", "Alive": True, "Resources": {"CPU": 4.0}},
         {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 16.0}}]


@pytest.fixture
def cluster_nodes(monkeypatch):
    import ray
    monkeypatch.setattr(ray, "nodes", lambda: [dict(n) for n in NODES])


def test_actors_larger_than_every_live_node_are_refused_by_the_largest_free_one(cluster_nodes, caplog):
    """Catches a room check that counts dead nodes, ignores the CPUs a replay server
    reserves, or refuses actors that merely wait for room (those get a warning)."""
    from herd.backends.ray_cluster import check_room
    with pytest.raises(ConfigError, match=r"--actor_cpus=5: no node .* \(the largest has 4\)"):
        check_room(5.0, actors=1)                                  # the dead node's 16 do not count
    with pytest.raises(ConfigError, match=r"--actor_cpus=4: no node .* \(the largest has 3 free\)"):
        check_room(4.0, actors=1, reserved={"large": 1.0})         # a replay server holds one of its 4
    with caplog.at_level("WARNING", logger="herd"):
        check_room(2.0, actors=3)                                  # 1 + 2 fit: the third waits
        assert not caplog.records
        check_room(2.0, actors=4)
    assert [r.getMessage() for r in caplog.records] == [
        "the Ray cluster has room for 3 of the 4 actors (--actor_cpus=2): the others wait for room"]


def test_the_replay_server_node_must_be_live_and_have_a_cpu(cluster_nodes):
    """Catches a --replay_server_node that names a dead or unknown node (the server would
    wait forever for a place), or a node with no CPU for the one it reserves."""
    from herd.backends.ray_cluster import check_server_node
    check_server_node("small", 1.0)
    for node in ("dead", "nosuchnode"):
        with pytest.raises(ConfigError, match=f"--replay_server_node={node}: no live node of the Ray cluster"):
            check_server_node(node, 1.0)
    with pytest.raises(ConfigError, match="--replay_server_node=head: the replay server reserves 1 CPU there"):
        check_server_node("head", 1.0)
