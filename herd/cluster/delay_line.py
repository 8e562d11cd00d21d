"""One link's delay line: the cable between a host and the bridge, in user space, holding
every frame for the link's one-way latency.

Why not `tc netem`: this machine's kernel (and CI's, the same) is built without sch_netem
and loads no modules, and neither fq (earliest departure time) nor tc classifiers exist
there. So a link that needs latency is two TAP devices, the host's `eth0` and the
bridge's port `p<i>`, and this process between them:

    host's stack -> eth0 (tbf: the host's send rate) -> [read, hold send_ms]  -> write p<i>  -> bridge
    bridge -> p<i> (tbf: the host's receive rate)     -> [read, hold receive_ms] -> write eth0 -> host's stack

The delay is constant per direction, so each direction is a FIFO (order kept, as on a
cable). Timing: select() sleeps with microsecond timeouts until the oldest held frame is
due, with this process's timer slack at 1 ns (the default would add up to 50 us); each
pass through the line costs about 0.1 ms more than the delay (measured: a round trip of
4 x 1 ms links took 4.47 ms, p50). The TAPs carry jumbo frames (MTU 65000, set by the
harness), so even 1 Gbit/s is only ~2,000 frames/s to copy here.

A cut cable (the harness sets p<i> down): writes into a down TAP fail (EIO) and the frame
is dropped, as a real cut drops it. The process runs until it is killed (the harness
kills every process of its namespaces on close). It is started inside the host's
namespace (`ip netns exec`), attaches `eth0` there, then enters the bridge's namespace to
attach its port, and prints "ready" once both ends are open. Standard library only."""
from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import fcntl
import os
import select
import struct
import sys
import time

READ_SIZE = 1 << 17          # more than any frame (the jumbo MTU + Ethernet header)
TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29


def attach_tap(name: str) -> int:
    """A non-blocking fd on the (already made, persistent) TAP device `name` of the
    current network namespace: reads give the frames it sends, writes deliver frames to it."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def enter_namespace(path: str) -> None:
    """This process moves into the network namespace at `path` (/run/netns/<name>). The
    TAP fds already open stay bound to their devices in the namespace they came from."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path) as ns:
        if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")


class Direction:
    """Frames read from `source`, written to `target` `delay_s` later, in order."""

    def __init__(self, source: int, target: int, delay_s: float):
        self.source, self.target, self.delay_s = source, target, delay_s
        self.held: collections.deque[tuple[float, bytes]] = collections.deque()   # (due, frame), due ascending
        self.dropped = 0

    def take(self, now: float) -> None:
        """Every frame waiting on the source, each due delay_s after it was read."""
        while True:
            try:
                frame = os.read(self.source, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as err:        # EIO: the TAP is down (a cut cable); nothing to read now
                if err.errno == errno.EIO:
                    return
                raise
            self.held.append((now + self.delay_s, frame))

    def deliver(self, now: float) -> None:
        """Every held frame that is due, written to the target; a frame the target refuses
        (down: EIO; full: EAGAIN/ENOBUFS) is dropped, as a wire drops it."""
        while self.held and self.held[0][0] <= now:
            _, frame = self.held.popleft()
            try:
                os.write(self.target, frame)
            except OSError as err:
                if err.errno not in (errno.EIO, errno.EAGAIN, errno.ENOBUFS):
                    raise
                self.dropped += 1

    def next_due(self) -> float | None:
        return self.held[0][0] if self.held else None


def run(directions: list[Direction]) -> None:
    by_source = {d.source: d for d in directions}
    while True:
        now = time.monotonic()
        for d in directions:
            d.deliver(now)
        dues = [due for d in directions if (due := d.next_due()) is not None]
        timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
        readable, _, _ = select.select(list(by_source), [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            by_source[fd].take(now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host_device", required=True, help="the host's TAP, in this (the host's) namespace")
    parser.add_argument("--bridge_namespace", required=True, help="path of the bridge's namespace (/run/netns/...)")
    parser.add_argument("--port", required=True, help="the host's TAP port on the bridge")
    parser.add_argument("--send_ms", type=float, required=True, help="delay of what the host sends")
    parser.add_argument("--receive_ms", type=float, required=True, help="delay of what the host receives")
    args = parser.parse_args()
    # The kernel's default timer slack (50 us) would add up to that to every held frame.
    ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    host = attach_tap(args.host_device)
    enter_namespace(args.bridge_namespace)
    port = attach_tap(args.port)
    print("ready", flush=True)
    run([Direction(host, port, args.send_ms / 1e3), Direction(port, host, args.receive_ms / 1e3)])


if __name__ == "__main__":
    sys.exit(main())
