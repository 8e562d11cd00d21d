"""The inference server's CUDA path (server.py uses it only on a CUDA device; a CPU server
reads the shared areas in place).

    copies        the clients' request and answer areas are page-locked in place
                  (cudaHostRegister), and a batch crosses PCIe as one span per field each
                  way, whatever the number of clients: the rows from its first client's to
                  its last client's (with the rows of clients between that did not ask,
                  which are not computed) go in with one asynchronous copy; the batch's rows
                  are gathered from them on the device, and their outputs are written into
                  a device mirror of the answer areas, whose same span goes back with one
                  copy. The clients in the span that did not ask get their own last answers
                  again (the mirror holds them), byte for byte, and read nothing before their
                  next answer. An LSTM core's states, which clients write into the same area
                  before asking, go back client by client instead. Where registering fails,
                  rows are gathered into a pinned staging buffer first (one more host copy)
    two sets      batch k+1 is gathered into the other set of device (and staging) buffers
                  while batch k's outputs travel back: server.py's loop launches k+1, then
                  answers k
    events        each batch records a blocking-sync CUDA event after its copies back;
                  answering waits on that event, sleeping, instead of a device-wide
                  synchronize() that spins
    precision     bf16 autocast and channels-last convolution weights (ServerOptions)
    graphs        a CUDA graph captured per padded batch size (8, 16, 32, ...) holding the
                  forward pass and the sampling, by default kept only for the sizes whose
                  replay measured faster than the eager pass at the server's start; weights
                  are copied into the captured parameters in place, so the graphs stay valid
    records       with --inference_records, each batch's observations and outputs are
                  written into the trajectories on the device (records.py), before the
                  batch's event: the learner copies them from there, device to device
    weights       a new version goes host -> pinned buffer -> device on the stream, in
                  place: batches launched after it use it, and service never stops; on the
                  learner's own GPU it comes device to device from the learner's board
                  (herd/device_weights.py) into a staging buffer on a side stream, checked
                  whole, then into the parameters on the stream

What could not be measured here (no GPU on the machine this was written on) is in
docs/inference.md. A DevicePath also runs on a CPU device, for tests of its copies: there
the areas count as registered and no events are recorded (server.py serves a CPU batch
in place instead).
"""
from __future__ import annotations

import logging
import time

import torch

from herd.device_weights import DeviceWeightBoard
from herd.devices import host_register
from herd.inference.forward import ServerOptions, policy_outputs
from herd.inference.records import StepRecords
from herd.weights import SharedWeights

log = logging.getLogger("herd")


class DevicePath:
    """The buffers, weights and (optional) graphs of one CUDA inference server.

    inputs / outputs: the server's flat request and response areas, name -> [C*R, ...]."""

    def __init__(self, model: torch.nn.Module, max_rows: int, inputs: dict, outputs: dict,
                 device: torch.device, options: ServerOptions, records: StepRecords | None = None):
        self.records = records
        self.max_rows = max_rows            # R: client c's rows start at flat row c * R
        self.model, self.inputs, self.outputs, self.device, self.options = model, inputs, outputs, device, options
        self.recurrent = "core_state" in inputs
        self.features = "features" in outputs
        if options.channels_last:
            self.model.to(memory_format=torch.channels_last)     # 4-D (conv) weights only
        self.params = [p for p in self.model.parameters()]
        self.pinned_weights = torch.empty(sum(p.numel() for p in self.params))
        if device.type == "cuda":
            self.pinned_weights = self.pinned_weights.pin_memory()
        self.weights_copied: torch.cuda.Event | None = None
        self.staged: torch.Tensor | None = None       # [P] on the device: the board path's copy
        self.copy_stream: torch.cuda.Stream | None = None
        # Each area once: core_state is both an input and an output (registering twice fails).
        areas = {t.data_ptr(): t for t in [*inputs.values(), *outputs.values()]}
        self.registered = all(host_register(t, device) for t in areas.values())
        # The answers as last sent, name -> [C*R, ...] on the device (the module docstring
        # says why): each batch writes its rows here and sends one span back from here.
        self.mirror = {name: torch.empty_like(t, device=device).copy_(t) for name, t in outputs.items()
                       if name != "core_state"} if self.registered else {}
        self.sets = [self.buffers() for _ in range(2)]
        self.turn = 0
        self.graphs = None
        if options.cuda_graphs and not self.recurrent:
            self.graphs = GraphedPolicy(self.model, inputs, self.features, options, device)
        log.info("inference server on %s: request areas %s, %s, %s%s", device,
                 "page-locked in place" if self.registered else "staged through pinned buffers",
                 "bf16" if options.bf16 else "fp32", "channels-last" if options.channels_last else "NCHW",
                 ", CUDA graphs" if self.graphs is not None else "")

    def buffers(self) -> dict:
        """One set: device inputs (and pinned staging and outputs where not registered)."""
        s = {"device": {name: torch.empty_like(t, device=self.device) for name, t in self.inputs.items()},
             "index": torch.empty(next(iter(self.inputs.values())).shape[0], dtype=torch.int64, device=self.device)}
        if not self.registered:
            s["staging"] = {name: torch.empty_like(t).pin_memory() for name, t in self.inputs.items()}
            s["back"] = {name: torch.empty_like(t).pin_memory() for name, t in self.outputs.items()}
        return s

    def pull(self, weights: SharedWeights | DeviceWeightBoard, have_version: int) -> int:
        """Copies newer published weights into the model, in place, on the stream."""
        if isinstance(weights, DeviceWeightBoard):
            return self.pull_device(weights, have_version)
        if self.weights_copied is not None:
            self.weights_copied.synchronize()      # the pinned buffer's last copy has left
        vector, version = weights.snapshot()
        self.pinned_weights.copy_(vector)
        self.load(self.pinned_weights.to(self.device, non_blocking=True))
        return version

    def pull_device(self, board: DeviceWeightBoard, have_version: int) -> int:
        """The learner's board (same device) -> staged [P], on a side stream, so the batches
        in flight on the stream go on; the board's re-check needs that copy finished, not
        theirs. Then staged -> parameters on the stream, behind those batches."""
        if self.staged is None:
            self.staged = torch.empty(board.slots.shape[1], dtype=torch.float32, device=self.device)
            self.copy_stream = torch.cuda.Stream(self.device)
        if self.weights_copied is not None:
            self.copy_stream.wait_event(self.weights_copied)   # the last load has read `staged`
        version = board.snapshot_into(self.staged, self.copy_stream)
        if version < 0:
            return have_version
        self.load(self.staged)       # the copy into staged is complete: the host waited for it
        return version

    def load(self, on_device: torch.Tensor) -> None:
        """on_device [P] -> the parameters, in place (graphs stay valid), on the stream;
        weights_copied fires once it is done."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(on_device[offset:offset + p.numel()].view_as(p))   # in place: graphs stay valid
                offset += p.numel()
        if self.device.type == "cuda":
            self.weights_copied = torch.cuda.Event(blocking=True)
            self.weights_copied.record()

    def launch(self, clients, rows, index: torch.Tensor, places=None) -> tuple[dict, torch.cuda.Event | None]:
        """Rows of `clients` (ascending) -> their outputs, launched; the event fires once they
        are in host memory (the shared areas when registered, else the set's pinned `back`)
        and, with `places` ([N, 2], records.py), recorded in the trajectories."""
        s = self.sets[self.turn]
        self.turn ^= 1
        n = len(index)
        if self.registered:
            first = int(clients[0]) * self.max_rows                               # the span's rows
            end = max(int(c) * self.max_rows + int(r) for c, r in zip(clients, rows))
            dev, local = self.span_in(s, first, end, index)
        else:
            dev = {}
            for name, source in self.inputs.items():
                staged = torch.index_select(source, 0, index, out=s["staging"][name][:n])
                dev[name] = s["device"][name][:n].copy_(staged, non_blocking=True)
        with torch.inference_mode():
            if self.graphs is not None and self.graphs.fits(n):
                results = self.graphs.run(dev, n)
            else:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.options.bf16):
                    results = policy_outputs(self.model, dev, self.recurrent, self.features)
        if places is not None:
            self.records.write(places, dev["obs"], results)
        if self.registered:
            self.span_out(first, end, local, clients, rows, results)
        else:
            results = {name: s["back"][name][:n].copy_(t, non_blocking=True) for name, t in results.items()}
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(blocking=True)   # blocking: its wait sleeps instead of spinning
            event.record()
        return results, event

    def span_in(self, s: dict, first: int, end: int, index: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
        """One copy per input of rows first..end-1 to the device, then the batch's rows [n]
        gathered there; returns them and where they lie in the span ([n] on the device, or
        None when the span is exactly the batch: nothing to gather)."""
        span = end - first
        for name, source in self.inputs.items():
            s["device"][name][:span].copy_(source[first:end], non_blocking=True)
        if span == len(index):
            return {name: t[:span] for name, t in s["device"].items()}, None
        local = s["index"][:len(index)].copy_(index - first, non_blocking=True)      # [n] rows in the span
        return {name: t[:span].index_select(0, local) for name, t in s["device"].items()}, local

    def span_out(self, first: int, end: int, local: torch.Tensor | None, clients, rows, results: dict) -> None:
        """The batch's outputs into the mirror (at `local`, span_in's), then one copy per
        output of the mirror's rows first..end-1 back to the shared areas; an LSTM core's
        states client by client."""
        for name, t in results.items():
            if name == "core_state":
                continue
            rows_of_span = self.mirror[name][first:end]
            if local is None:
                rows_of_span.copy_(t)
            else:
                rows_of_span.index_copy_(0, local, t)
            self.outputs[name][first:end].copy_(rows_of_span, non_blocking=True)
        if "core_state" in results:
            offset = 0
            for c, r in zip(clients, rows):
                start = int(c) * self.max_rows
                self.outputs["core_state"][start:start + r].copy_(results["core_state"][offset:offset + r],
                                                                  non_blocking=True)
                offset += int(r)

    def finish(self, clients, rows, index: torch.Tensor, results: dict, event) -> None:
        """Waits (sleeping) for a launched batch; where not registered, scatters its outputs."""
        if event is not None:
            event.synchronize()
        if not self.registered:
            for name, tensor in results.items():
                self.outputs[name].index_copy_(0, index, tensor)


def seconds_per_call(call, calls: int = 20, synchronize=torch.cuda.synchronize) -> float:
    """Wall seconds per call of `call` (launch and run), after 3 warm-up calls, with the
    device synchronised before and after the timed calls."""
    for _ in range(3):
        call()
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    synchronize()
    return (time.perf_counter() - start) / calls


def faster_replayed(timings: dict) -> list:
    """size -> (seconds per replay, seconds per eager pass): the sizes whose replay was faster."""
    return sorted(size for size, (replay, eager) in timings.items() if replay < eager)


class GraphedPolicy:
    """CUDA graphs of the forward pass and sampling, one per padded batch size: a batch of n
    rows runs in the smallest captured size >= n (the padding rows compute and are ignored).
    With options.graphs_measured, a size's graph is kept only where replaying it measured
    faster than running the same pass eagerly, at the server's start (the log says which)."""

    def __init__(self, model, inputs: dict, features: bool, options: ServerOptions, device: torch.device):
        total = next(iter(inputs.values())).shape[0]
        sizes, size = [], 8
        while size < total:
            sizes.append(size)
            size *= 2
        sizes.append(total)
        self.graphs: dict[int, tuple] = {}
        for size in sizes:
            static = {name: torch.zeros((size, *t.shape[1:]), dtype=t.dtype, device=device) for name, t in inputs.items()}
            try:
                self.graphs[size] = (static, *self.capture(model, static, features, options))
            except Exception as err:   # capture can fail (an op that syncs): run those sizes eagerly
                log.warning("inference server: no CUDA graph for %d rows (%s); running them eagerly", size, err)
                break
        if options.graphs_measured:
            self.keep_faster(model, features, options)

    def keep_faster(self, model, features: bool, options: ServerOptions) -> None:
        """Drops the graphs whose replay is not faster than the eager pass on the same rows."""
        def eager(static: dict):
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=options.bf16):
                return policy_outputs(model, static, False, features)
        timings = {size: (seconds_per_call(graph.replay), seconds_per_call(lambda: eager(static)))
                   for size, (static, graph, _) in self.graphs.items()}
        kept = faster_replayed(timings)
        self.graphs = {size: self.graphs[size] for size in kept}
        log.info("inference server: CUDA graphs kept for %s rows (replay against eager, us per call: %s)",
                 ", ".join(map(str, kept)) or "no", ", ".join(f"{size}: {1e6 * replay:.0f}/{1e6 * eager_s:.0f}"
                                                           for size, (replay, eager_s) in timings.items()))

    @staticmethod
    def capture(model, static: dict, features: bool, options: ServerOptions):
        def step():
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=options.bf16,
                                                        cache_enabled=False):
                return policy_outputs(model, static, False, features)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):               # warm-up, as torch.cuda.graphs asks, off the main stream
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = step()
        return graph, outputs

    def fits(self, n: int) -> bool:
        return any(size >= n for size in self.graphs)

    def run(self, dev: dict, n: int) -> dict:
        size = min(s for s in self.graphs if s >= n)
        static, graph, outputs = self.graphs[size]
        for name, t in dev.items():
            static[name][:n].copy_(t)
        graph.replay()
        return {name: t[:n] for name, t in outputs.items()}
