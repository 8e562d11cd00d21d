"""Two learners on two hosts (network namespaces joined by shaped links: 1 Gbit/s, 0.5 ms
each way), one torch.distributed group (gloo) over those links: their weights stay
bit-identical."""
import os
import subprocess
import sys

import torch

from herd_testing import ROOT
from herd.cluster.netns import LinkShape
from herd.learner.distributed import HEADER, MAX_EPISODES

K = 20          # updates


def test_two_learners_on_two_hosts_stay_bit_identical(hosts_or_fail, tmp_path):
    """Catches learners that diverge once their rounds cross a real link (a reduction that
    differs by host, a rendezvous bound to loopback that never leaves one host), and a
    group whose traffic does not go over the hosts' link at all."""
    script = str(ROOT / "tests" / "cluster" / "two_learners.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with hosts_or_fail(2, LinkShape(bandwidth_mbit=1000, latency_ms=0.5)) as net:
        master = net.hosts[0].address
        learners = [host.popen([sys.executable, script, str(host.index), master, "29511", str(tmp_path), str(K)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for host in net.hosts]
        for learner in learners:
            _, err = learner.communicate(timeout=240)
            assert learner.returncode == 0, err[-3000:]
        sent = net.hosts[1].link_bytes()["tx"]
    first, second = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    changed = 0
    for name, value in first["final"].items():
        assert torch.equal(first["initial"][name], second["initial"][name]), name    # the broadcast at the start
        assert torch.equal(value, second["final"][name]), name                       # the same bits after K updates
        changed += not torch.equal(value, first["initial"][name])
    assert changed >= len(first["final"]) - 2, changed         # all but the feature head (no gradient) moved
    # Every round all-reduced one float32 buffer (gradients and a row per learner: herd's
    # GroupSync); with two learners each sends the whole buffer's worth over its link.
    row = len(HEADER) + 2 * MAX_EPISODES
    buffer = sum(v.numel() for v in first["final"].values()) + 2 * row
    assert sent >= K * buffer * 4, (sent, buffer)
