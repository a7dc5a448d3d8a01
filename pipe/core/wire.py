"""The wire: send and receive by peer and tag, and all-reduce, between ranks.

`MindSporeWire` (GPU, Ascend, under `msrun`): ops.Send / Receive / AllReduce over NCCL or
HCCL. `MpiWire` (CPU, where MindSpore has no Send/Receive): mpi4py under `mpiexec`, its
sends synchronous as NCCL's are, so an order that could hang on GPUs hangs on CPU too.
"""
import os

import mindspore as ms
import numpy as np

__all__ = ["WIRE_DTYPES", "connect", "MpiWire", "MindSporeWire", "SoloWire", "PointToPoint",
           "write_header", "read_header"]

# Every dtype a pipeline may send, and its numpy type for the CPU wire (None: numpy has none).
WIRE_DTYPES = {ms.float32: np.float32, ms.float16: np.float16, ms.bfloat16: None,
               ms.float64: np.float64, ms.int32: np.int32, ms.int64: np.int64}
DTYPES = list(WIRE_DTYPES)      # a dtype travels in a header as its index here
HEADER = 8                      # int32s: rank of the shape, dtype index, dims...


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


def write_header(spec):
    """(shape, dtype) as a fixed-size int32 array; None (nothing to say) as -1s."""
    header = np.full(HEADER, -1, np.int32)
    if spec is not None:
        shape, dtype = spec
        header[:2 + len(shape)] = [len(shape), DTYPES.index(dtype), *shape]
    return header


def read_header(header):
    if header[0] < 0:
        return None
    return tuple(int(d) for d in header[2:2 + header[0]]), DTYPES[int(header[1])]


class PointToPoint:
    """One rank's pipeline messages, as the lowered schedule stamped them (peer, tag,
    boundary). `ranks[peer]`: the peer stage's rank; `shapes[b]`: (shape, dtype) of what
    crosses boundary b, the activation into virtual stage b or its gradient back."""

    def __init__(self, wire, pipeline_ranks, shapes):
        self.wire, self.ranks, self.shapes = wire, pipeline_ranks, shapes

    def send(self, tensor, action):
        self.wire.send(tensor, self.ranks[action.peer], action.tag)

    def recv(self, action):
        shape, dtype = self.shapes[action.boundary]
        return self.wire.recv(shape, dtype, self.ranks[action.peer], action.tag)
