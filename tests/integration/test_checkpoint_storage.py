"""A run's last checkpoint holds each tensor in a storage of its own, as the periodic ones
do: a CPU learner's parameters are views of the actors' shared weight vector
(herd/weights.py adopt), and saved as they are they would all point into one storage of
the whole vector (a format no older herd wrote, and a file in which no weight is found by
its own bytes: tests/herd_testing.py corrupt_first_weight)."""
import torch

from herd.checkpoint import CHECKPOINT_DIR, list_checkpoints


def test_the_last_checkpoint_stores_every_model_tensor_on_its_own(small_cartpole_run):
    newest = list_checkpoints(small_cartpole_run / CHECKPOINT_DIR)[0]
    state = torch.load(newest, map_location="cpu", weights_only=True)
    model = state["model"]
    assert len(model) > 4
    for name, tensor in model.items():
        assert tensor.storage_offset() == 0, name
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size(), name
