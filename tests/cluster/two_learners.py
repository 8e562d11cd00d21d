"""One of two learners in a torch.distributed group across two namespace hosts (run by
test_learners_on_hosts.py inside a host): joins the group at MASTER_ADDR (host 0's link
address) over gloo bound to the host's eth0, takes K Adam updates on its own batches with
the gradients averaged every update, and saves its weights.

The model, batches and learner are tests/learner/test_distributed.py's own (loaded from
its file), so both tests train the same thing; only where the two learners run differs.
Usage: python two_learners.py RANK MASTER_ADDR PORT OUT_DIR K"""
import importlib.util
import os
import sys
from pathlib import Path

import torch

from herd.learner.distributed import GroupSync, broadcast_state, join_group, leave_group

rank, address, port, out, updates = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
spec = importlib.util.spec_from_file_location(
    "distributed_helpers", Path(__file__).resolve().parents[1] / "learner" / "test_distributed.py")
helpers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helpers)

# The rendezvous and every collective over the host's one link, as on a real machine
# (gloo would otherwise pick the interface its hostname resolves to, absent in a namespace).
os.environ.update(MASTER_ADDR=address, MASTER_PORT=port, GLOO_SOCKET_IFNAME="eth0")
group = join_group(rank, 2, "cpu", timeout_s=120, port=None)
try:
    model = helpers.new_model(seed=rank + 1)       # different on purpose: broadcast_state makes them equal
    broadcast_state(model)
    initial = helpers.params(model)
    learner = helpers.new_learner(model, "adam", GroupSync(group, model.parameters()).exchange)
    for k in range(updates):
        learner.step(helpers.make_batch(100 * k + rank))
    torch.save({"initial": initial, "final": helpers.params(model)}, out / f"rank{rank}.pt")
finally:
    leave_group()
