"""The wire: moving tensors between ranks.

Two backends with one small interface (`send`, `recv`, `all_reduce`):

* `MindSporeWire` (GPU, Ascend): `ops.Send` / `ops.Receive` / `ops.AllReduce` over NCCL or
  HCCL, started by `msrun`.
* `MpiWire` (CPU, where MindSpore has no Send/Receive kernels): mpi4py, started by `mpiexec`.
  Sends are synchronous (`Issend`): they complete only once the receiver has posted the
  matching receive, as NCCL's do, so a message order that could hang on GPUs hangs on CPU
  too, and every wait has a deadline instead of blocking forever.

`PointToPoint` carries one rank's pipeline messages: each send or receive action of a
lowered schedule names its peer and tag, and the wire needs nothing else.
"""
import os
import sys
import time

import numpy as np
import mindspore as ms

from pipe.watchdog import PeerFailed

__all__ = ["WIRE_DTYPES", "connect", "MpiWire", "MindSporeWire", "SoloWire", "PointToPoint",
           "WireTimeout"]


# Every dtype a pipeline may send, and its numpy type for the CPU wire (None: numpy has none).
WIRE_DTYPES = {ms.float32: np.float32, ms.float16: np.float16, ms.bfloat16: None,
               ms.float64: np.float64, ms.int32: np.int32, ms.int64: np.int64}


class WireTimeout(RuntimeError):
    """A send, receive or all-reduce saw no progress for `timeout` seconds."""


class SoloWire:
    """One process, nothing to talk to: all-reduce over a group of one is the identity."""

    rank, size, has_deadlines = 0, 1, True
    dtypes = set(WIRE_DTYPES)          # nothing travels

    def all_reduce(self, tensor, ranks):
        return tensor

    def abort(self, code, reason=""):
        sys.exit(code)


class MpiWire:
    """mpi4py on CPU. Tensors travel as numpy arrays; waits poll so they can time out.
    `communicator` (default: all processes) lets one launch host several pipelines.

    A rank that fails tells every other rank first (`abort`): a short notice on a tag of
    its own, which every wait also polls for, so a peer waiting on the failed rank stops
    at once with a line naming it (`PeerFailed`) instead of waiting out its deadline."""

    NOTICE = 32767                       # the tag of a failure notice (MPI allows at least this)

    def __init__(self, timeout, communicator=None):
        from mpi4py import MPI
        self.MPI, self.world = MPI, communicator or MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.timeout, self.has_deadlines = timeout, True
        self.dtypes = {dtype for dtype, numpy_type in WIRE_DTYPES.items() if numpy_type}
        self.groups = {}

    def _wait(self, request, what):
        """Poll until done. The pause doubles up to 1 ms: a quick message is taken at once,
        and a long wait (a peer compiling) leaves the CPU to the processes doing work."""
        deadline, pause = time.monotonic() + self.timeout, 20e-6
        while not request.Test():
            status = self.MPI.Status()
            if self.world.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.NOTICE, status=status):
                peer = status.Get_source()
                notice = self.world.recv(source=peer, tag=self.NOTICE)
                raise PeerFailed(f"rank {self.rank} stopped waiting to {what}: rank {peer} "
                                 f"failed ({notice}); rank {peer}'s error says why")
            if time.monotonic() > deadline:     # (not cancelled: the job is ended next)
                raise WireTimeout(f"rank {self.rank}: no progress for {self.timeout:g} s while "
                                  f"waiting to {what}")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def abort(self, code, reason="", grace=2.0):
        """End every process of the job (a normal exit would wait for stuck peers): first
        a notice of `reason` to every rank, then a moment in which peers can say where they
        were."""
        self.notices = [self.world.isend(reason or "it ended", dest=peer, tag=self.NOTICE)
                        for peer in range(self.size) if peer != self.rank]   # kept until Abort
        sys.stderr.flush()
        time.sleep(grace)
        self.world.Abort(code)

    def send(self, tensor, dst, tag):
        self._send(tensor.asnumpy(), dst, tag)

    def recv(self, shape, dtype, src, tag):
        return ms.Tensor(self._recv(shape, dtype, src, tag))

    def _send(self, array, dst, tag):
        data = np.ascontiguousarray(array)
        self._wait(self.world.Issend(data, dest=dst, tag=tag), f"send (tag {tag}) to rank {dst}")

    def _recv(self, shape, dtype, src, tag):
        data = np.empty(shape, WIRE_DTYPES[dtype])
        self._wait(self.world.Irecv(data, source=src, tag=tag), f"receive (tag {tag}) from rank {src}")
        return data

    def graph_send(self, dst, tag):
        """A send that runs inside a compiled graph: mpi4py called from a pyfunc operator
        (MindSpore's CPU has no Send kernel). It returns a token to order what follows."""
        def send(x):
            self._send(x, dst, tag)
            return np.zeros((1,), np.float32)
        return ms.ops.Custom(send, out_shape=lambda x: (1,), out_dtype=lambda x: ms.float32,
                             func_type="pyfunc")

    def graph_recv(self, shape, dtype, src, tag):
        """A receive inside a compiled graph; its input (a token) orders it."""
        def recv(token):
            return self._recv(shape, dtype, src, tag)
        return ms.ops.Custom(recv, out_shape=lambda token: tuple(shape),
                             out_dtype=lambda token: dtype, func_type="pyfunc")

    def _group(self, ranks):
        if ranks not in self.groups:
            self.groups[ranks] = self.world.Create_group(self.world.Get_group().Incl(list(ranks)))
        return self.groups[ranks]

    def all_reduce(self, tensor, ranks):
        """Sum over `ranks` (a tuple containing this rank)."""
        if len(ranks) == 1:
            return tensor
        data = np.ascontiguousarray(tensor.asnumpy())
        out = np.empty_like(data)
        request = self._group(ranks).Iallreduce(data, out, op=self.MPI.SUM)
        self._wait(request, f"all-reduce over ranks {list(ranks)}")
        return ms.Tensor(out)


class MindSporeWire:
    """MindSpore's communication operators over NCCL (GPU) or HCCL (Ascend), PyNative."""

    def __init__(self):
        from mindspore.communication import GlobalComm, get_group_size, get_rank, init
        init()
        # Read after init(): the operators' default group was bound at import time to HCCL's name.
        self.world = GlobalComm.WORLD_COMM_GROUP
        self.rank, self.size = get_rank(), get_group_size()
        self.has_deadlines = False       # NCCL/HCCL waits cannot time out: the engine watches
        self.dtypes = set(WIRE_DTYPES)
        self.ops = {}

    def _op(self, key, make):
        if key not in self.ops:
            self.ops[key] = make()
        return self.ops[key]

    def abort(self, code, reason=""):
        """msrun ends every other worker within a second of one exiting with an error
        (its join loop); peers of other launchers end by their own watchdogs."""
        os._exit(code)

    def send(self, tensor, dst, tag):
        self._op(("send", dst, tag), lambda: ms.ops.Send(tag, dst, group=self.world))(tensor)

    def recv(self, shape, dtype, src, tag):
        return self._op(("recv", src, tag, tuple(shape), dtype), lambda: ms.ops.Receive(
            tag, src, list(shape), dtype, group=self.world))()

    def graph_send(self, dst, tag):
        """ops.Send works inside a compiled graph as it is."""
        return ms.ops.Send(tag, dst, group=self.world)

    def graph_recv(self, shape, dtype, src, tag):
        """ops.Receive inside a compiled graph; its optional input (a float32 token) orders it."""
        return ms.ops.Receive(tag, src, list(shape), dtype, group=self.world)

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


def connect(device, timeout):
    """The wire for this process. `device` is MindSpore's device target.

    On CPU, mpi4py decides the world (one process without `mpiexec`). On GPU/Ascend a
    multi-process run is one started by `msrun`, which sets MS_WORKER_NUM.
    """
    if device == "CPU":
        wire = MpiWire(timeout)
        return wire if wire.size > 1 else SoloWire()
    if int(os.environ.get("MS_WORKER_NUM", "1")) > 1:
        return MindSporeWire()
    return SoloWire()


class PointToPoint:
    """One rank's pipeline messages, as its lowered schedule stamped them (peer, tag,
    boundary). `ranks[peer]` is the peer's global rank; `shapes[b]` the (shape, dtype) of
    what crosses boundary b: the activation into virtual stage b, or its gradient back."""

    def __init__(self, wire, pipeline_ranks, shapes):
        self.wire, self.ranks, self.shapes = wire, pipeline_ranks, shapes

    def with_rows(self, rows):
        """The same messages for micro-batches of `rows` rows (predict's batch size)."""
        return PointToPoint(self.wire, self.ranks, {b: ((rows,) + shape[1:], dtype)
                                                    for b, (shape, dtype) in self.shapes.items()})

    def send(self, tensor, action):
        self.wire.send(tensor, self.ranks[action.peer], action.tag)

    def recv(self, action):
        shape, dtype = self.shapes[action.boundary]
        return self.wire.recv(shape, dtype, self.ranks[action.peer], action.tag)

    def graph_op(self, action):
        """The operator that carries `action` inside a compiled graph (pipe.step_graph)."""
        if action.kind[0] == "s":
            return self.wire.graph_send(self.ranks[action.peer], action.tag)
        shape, dtype = self.shapes[action.boundary]
        return self.wire.graph_recv(shape, dtype, self.ranks[action.peer], action.tag)
