"""A weight publisher that fails is noticed: the next publish raises PublishFailed, one line
that ends the run, instead of a dead thread whose every later publish is skipped as "busy"
(the actors then act on frozen weights for the rest of the run)."""
import threading
import time

import pytest
import torch

from herd.errors import PublishFailed
from herd.learner.courier import OneInFlight
from herd.learner.publisher import WeightPublisher, publish_failed


def broken_store(fail_at: int):
    """A store whose write raises from version `fail_at` on; records the versions written."""
    written = []

    def write(vector, version):
        if version >= fail_at:
            raise OSError(28, "No space left on device\nsecond line")
        written.append(version)
    return write, written


def test_a_job_that_raises_is_reported_to_the_next_offer_in_one_line():
    courier = OneInFlight("test-publisher", publish_failed)
    done = threading.Event()
    assert courier.offer(done.set)
    assert done.wait(10)

    def fail():
        raise OSError(28, "No space left on device\nsecond line")
    deadline = time.monotonic() + 10
    while not courier.offer(fail):            # the first job may still be clearing
        assert time.monotonic() < deadline
    courier.thread.join(10)
    assert not courier.thread.is_alive()
    with pytest.raises(PublishFailed) as raised:
        courier.offer(lambda: None)
    assert "No space left on device" in str(raised.value) and "\n" not in str(raised.value)
    courier.close()                             # returns: a finally that ends a run must not hang


def test_a_cpu_publisher_whose_store_raises_ends_in_one_line():
    write, written = broken_store(fail_at=2)
    publish = WeightPublisher(torch.nn.Linear(3, 2), write)
    publish(1)
    with pytest.raises(PublishFailed, match="frozen weights") as raised:
        publish(2)
    assert written == [1] and "\n" not in str(raised.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the publisher thread runs on a GPU learner")
def test_a_gpu_publisher_whose_thread_raises_ends_the_run_at_the_next_publish():
    write, written = broken_store(fail_at=2)
    publish = WeightPublisher(torch.nn.Linear(3, 2).cuda(), write)
    publish(1)
    deadline = time.monotonic() + 30
    while written != [1]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    publish(2)                                  # the thread raises on this one
    with pytest.raises(PublishFailed, match="frozen weights"):
        for version in range(3, 300):           # a dead thread once made every one "skipped"
            time.sleep(0.01)
            publish(version)
    assert written == [1]
    publish.close()
