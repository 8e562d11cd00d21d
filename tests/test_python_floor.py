"""herd's actors start from multiprocessing's fork server, which before Python 3.10.9 and
in 3.11.0 (CVE-2022-42919) listened where any local user could reach it and have it run
code as the user: pyproject.toml's requires-python excludes those, and a checkout run
from its folder by one is refused in one line before any actor starts."""
import sys
import tomllib

import pytest
from packaging.specifiers import SpecifierSet

from herd.backends.start import check_fork_server_python, fork_server_is_private
from herd.errors import ConfigError
from herd_testing import ROOT

AFFECTED = ["3.10.0", "3.10.8", "3.11.0"]
FIXED = ["3.10.9", "3.10.14", "3.11.1", "3.11.7", "3.12.0", "3.13.2"]


def requires_python() -> SpecifierSet:
    return SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])


def test_pip_installs_herd_on_fixed_pythons_only():
    allowed = requires_python()
    assert [v for v in AFFECTED if v in allowed] == []
    assert [v for v in FIXED if v not in allowed] == []
    assert ".".join(map(str, sys.version_info[:3])) in allowed      # the Python these tests run on


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the affected socket is a Linux abstract one")
@pytest.mark.parametrize("version", AFFECTED)
def test_an_affected_python_is_refused_in_one_line(version):
    parts = tuple(int(p) for p in version.split("."))
    assert not fork_server_is_private(parts)
    with pytest.raises(ConfigError, match=f"Python {version}'s fork server.*CVE-2022-42919") as err:
        check_fork_server_python(parts)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("version", FIXED)
def test_a_fixed_python_passes(version):
    check_fork_server_python(tuple(int(p) for p in version.split(".")))
