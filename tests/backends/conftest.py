"""Fixtures of the Ray backend's tests that talk to real Ray actors."""
import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A one-node local Ray on loopback (2 CPUs), for the tests of one module: a new one
    (address="local"), never another cluster running on this machine."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", object_store_memory=80 * 2**20,
             log_to_driver=False)
    yield
    ray.shutdown()
