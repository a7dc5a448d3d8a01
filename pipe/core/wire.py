"""The wire: send and receive by peer and tag, and all-reduce, between ranks.

`MindSporeWire` (GPU, Ascend, under `msrun`): ops.Send / Receive / AllReduce over NCCL or
HCCL. `MpiWire` (CPU, where MindSpore has no Send/Receive): mpi4py under `mpiexec`, its
sends synchronous as NCCL's are, so an order that could hang on GPUs hangs on CPU too.
"""
import os

import mindspore as ms
import numpy as np

__all__ = ["WIRE_DTYPES", "connect", "MpiWire", "MindSporeWire", "SoloWire", "PointToPoint",
           "Parts", "spec_of", "example", "write_header", "read_header"]

# Every dtype a pipeline may send, and its numpy type for the CPU wire (None: numpy has none).
WIRE_DTYPES = {ms.float32: np.float32, ms.float16: np.float16, ms.bfloat16: None,
               ms.float64: np.float64, ms.int32: np.int32, ms.int64: np.int64}
DTYPES = list(WIRE_DTYPES)      # a dtype travels in a header as its index here
PARTS, PART = 8, 8              # a tuple's most elements; int32s per (shape rank, dtype, dims)
HEADER = 1 + PARTS * PART       # -1: nothing; 0: a tensor; n: a tuple of n. Then the parts.


class SoloWire:
    """One process, nothing to talk to: all-reduce over a group of one is the identity."""

    rank, size, dtypes = 0, 1, set(WIRE_DTYPES)

    def all_reduce(self, tensor, ranks):
        return tensor


class MpiWire:
    """mpi4py on CPU; tensors travel as numpy arrays. `communicator` (default: all
    processes) lets one launch host several pipelines."""

    def __init__(self, communicator=None):
        from mpi4py import MPI
        self.MPI, self.world = MPI, communicator or MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.dtypes = {dtype for dtype, numpy_type in WIRE_DTYPES.items() if numpy_type}
        self.groups = {}

    def wait(self, request, what):
        """Block until `request` completes (`what` it is, for a subclass that reports)."""
        request.Wait()

    def send(self, tensor, dst, tag):
        self.send_array(tensor.asnumpy(), dst, tag)

    def recv(self, shape, dtype, src, tag):
        return ms.Tensor(self.recv_array(shape, dtype, src, tag))

    def send_array(self, array, dst, tag):
        data = np.ascontiguousarray(array)
        self.wait(self.world.Issend(data, dest=dst, tag=tag), f"send (tag {tag}) to rank {dst}")

    def recv_array(self, shape, dtype, src, tag):
        data = np.empty(shape, WIRE_DTYPES[dtype])
        self.wait(self.world.Irecv(data, source=src, tag=tag), f"receive (tag {tag}) from rank {src}")
        return data

    def all_reduce(self, tensor, ranks):
        """Sum over `ranks` (a tuple containing this rank)."""
        if len(ranks) == 1:
            return tensor
        if ranks not in self.groups:
            self.groups[ranks] = self.world.Create_group(self.world.Get_group().Incl(list(ranks)))
        data = np.ascontiguousarray(tensor.asnumpy())
        out = np.empty_like(data)
        self.wait(self.groups[ranks].Iallreduce(data, out, op=self.MPI.SUM),
                  f"all-reduce over ranks {list(ranks)}")
        return ms.Tensor(out)


class MindSporeWire:
    """MindSpore's communication operators over NCCL (GPU) or HCCL (Ascend), PyNative."""

    def __init__(self):
        from mindspore.communication import GlobalComm, get_group_size, get_rank, init
        init()
        # Read after init(): the operators' default group was bound at import time to HCCL's name.
        self.world = GlobalComm.WORLD_COMM_GROUP
        self.rank, self.size = get_rank(), get_group_size()
        self.dtypes = set(WIRE_DTYPES)
        self.ops = {}

    def _op(self, key, make):
        if key not in self.ops:
            self.ops[key] = make()
        return self.ops[key]

    def send(self, tensor, dst, tag):
        self._op(("send", dst, tag), lambda: ms.ops.Send(tag, dst, group=self.world))(tensor)

    def recv(self, shape, dtype, src, tag):
        return self._op(("recv", src, tag, tuple(shape), dtype), lambda: ms.ops.Receive(
            tag, src, list(shape), dtype, group=self.world))()

    def all_reduce(self, tensor, ranks):
        if len(ranks) == 1:
            return tensor
        return self._op(("all_reduce", ranks), lambda: ms.ops.AllReduce(
            group=self._group(ranks)))(tensor)

    def _group(self, ranks):
        if len(ranks) == self.size:
            return self.world
        from mindspore.communication import create_group
        name = "ranks_" + "_".join(map(str, ranks))
        create_group(name, list(ranks))
        return name


def connect(device):
    """This process's wire on `device` (MindSpore's device target): MindSpore's on
    GPU/Ascend in a job `msrun` started (it sets MS_WORKER_NUM), mpi4py's on CPU."""
    if device != "CPU":
        return MindSporeWire() if int(os.environ.get("MS_WORKER_NUM", "1")) > 1 else SoloWire()
    wire = MpiWire()
    return wire if wire.size > 1 else SoloWire()


class Parts(tuple):
    """The spec of a tuple of tensors: one (shape, dtype) per element."""


def spec_of(value):
    """(shape, dtype) of a tensor; Parts of those of a tuple's elements."""
    if isinstance(value, tuple):
        return Parts(spec_of(v) for v in value)
    return tuple(value.shape), value.dtype


def example(spec):
    """Ones of `spec`: what a stage's forward is first run on."""
    return tuple(map(example, spec)) if isinstance(spec, Parts) else ms.ops.ones(*spec)


def write_header(spec):
    """A spec as a fixed-size int32 array; None (nothing to say) as -1s."""
    header = np.full(HEADER, -1, np.int32)
    if spec is not None:
        parts = spec if isinstance(spec, Parts) else [spec]
        if len(parts) > PARTS:
            raise ValueError(f"a layer returns a tuple of {len(parts)} tensors; at most {PARTS} "
                             "cross a stage boundary: return fewer")
        header[0] = len(spec) if isinstance(spec, Parts) else 0
        for k, (shape, dtype) in enumerate(parts):
            header[1 + k * PART:3 + k * PART + len(shape)] = [len(shape), DTYPES.index(dtype), *shape]
    return header


def read_header(header):
    if header[0] < 0:
        return None
    parts = [header[1 + k * PART:1 + (k + 1) * PART] for k in range(max(1, header[0]))]
    specs = [(tuple(int(d) for d in p[2:2 + p[0]]), DTYPES[int(p[1])]) for p in parts]
    return Parts(specs) if header[0] else specs[0]


class PointToPoint:
    """One rank's pipeline messages, as the lowered schedule stamped them (peer, tag,
    boundary). `ranks[peer]`: the peer stage's rank; `shapes[b]`: the spec of what crosses
    boundary b, the activation into virtual stage b or its gradient back. A tuple travels
    as one message per element, in order; an element that is not float (a mask, ids)
    has no gradient: none travels back, the receiver puts zeros in its place."""

    def __init__(self, wire, pipeline_ranks, shapes):
        self.wire, self.ranks, self.shapes = wire, pipeline_ranks, shapes

    def send(self, value, action):
        spec = self.shapes[action.boundary]
        for tensor, part in zip(_listed(value, spec), _listed(spec, spec)):
            if _travels(part, action):
                self.wire.send(tensor, self.ranks[action.peer], action.tag)

    def recv(self, action):
        spec = self.shapes[action.boundary]
        got = [self.wire.recv(*part, self.ranks[action.peer], action.tag)
               if _travels(part, action) else ms.ops.zeros(*part) for part in _listed(spec, spec)]
        return tuple(got) if isinstance(spec, Parts) else got[0]


def _listed(value, spec):
    """`value` (a tensor or tuple of `spec`, or the spec itself) as a list of elements."""
    return list(value) if isinstance(spec, Parts) else [value]


def _travels(part, action):
    """Activations all travel forward; only float elements' gradients travel back."""
    return action.kind.endswith("F") or part[1].is_floating_point
