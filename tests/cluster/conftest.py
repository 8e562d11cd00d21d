"""The network-namespace harness (herd/cluster) for the tests here. Where namespaces
cannot be made, a test that needs them FAILS with the harness's one line: it never
passes or skips silently."""
from contextlib import contextmanager

import pytest

from herd.cluster.netns import NamespaceError, NetnsCluster


@contextmanager
def open_hosts(*args, **kwargs):
    """NetnsCluster(*args, **kwargs), open; pytest.fail with its one line where it cannot be made."""
    net = NetnsCluster(*args, **kwargs)
    try:
        net.open()
    except NamespaceError as err:
        pytest.fail(f"network namespaces: {err}", pytrace=False)
    try:
        yield net
    finally:
        net.close()


@pytest.fixture(scope="session")
def hosts_or_fail():
    """open_hosts, for tests (a fixture: the test modules import no conftest)."""
    return open_hosts
