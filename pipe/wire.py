"""The wire: send and receive by peer and tag, and all-reduce: MindSpore's ops over NCCL or
HCCL (`msrun`), or on CPU mpi4py (`mpiexec`), its sends synchronous as NCCL's."""
import time

import mindspore as ms
import numpy as np

__all__ = ["WIRE_DTYPES", "NCCL_DTYPES", "CARRIED_AS", "DTYPES", "MpiWire",
           "MindSporeWire", "SoloWire", "PointToPoint", "Parts", "spec_of", "example",
           "write_header", "read_header", "elements", "tensors_in", "travels", "carrier",
           "sum_over", "every_rank"]

# The dtypes a wire sends, and each one's numpy type for the CPU wire (None: numpy has none).
WIRE_DTYPES = {ms.float32: np.float32, ms.float16: np.float16, ms.bfloat16: None,
               ms.float64: np.float64, ms.int32: np.int32, ms.int64: np.int64}
NCCL_DTYPES = (ms.float32, ms.float16, ms.int32)   # MindSpore's GPU Send/Receive kernels: no others
# Narrow ints and bool travel as int32 (exact; a kernel every wire has), narrowed back on arrival.
CARRIED_AS = {ms.bool_: ms.int32, ms.uint8: ms.int32, ms.int8: ms.int32, ms.int16: ms.int32}
# Every dtype a layer may hand on; a spec's dtype travels in a header as its index here.
DTYPES = [*WIRE_DTYPES, *CARRIED_AS, ms.uint16, ms.uint32, ms.uint64, ms.complex64, ms.complex128]
HEADER = 64                     # int32s in a spec's header (write_header)


def carrier(dtype):
    return CARRIED_AS.get(dtype, dtype)


def travels(kind, dtype):   # forward every tensor; back only a float's gradient (ints: zeros)
    return kind in ("sF", "rF") or dtype.is_floating_point


class SoloWire:
    """One process, nothing to talk to: all-reduce over a group of one is the identity."""

    rank, size, dtypes = 0, 1, set(WIRE_DTYPES)

    def all_reduce(self, tensor, ranks):
        return tensor


class MpiWire:
    """mpi4py on CPU; `communicator` (default: all) lets one launch host several pipelines."""

    def __init__(self, communicator=None):
        from mpi4py import MPI
        self.MPI, self.world = MPI, communicator or MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.dtypes = {dtype for dtype, numpy_type in WIRE_DTYPES.items() if numpy_type}
        self.groups = {}

    def wait(self, request, what):
        """Until `request` (`what`) completes, polling: MPICH's blocking wait spins a core."""
        while not request.Test():
            time.sleep(1e-4)

    def send(self, tensor, dst, tag):
        self.send_array(tensor.asnumpy(), dst, tag)

    def recv(self, shape, dtype, src, tag):
        return ms.Tensor(self.recv_array(shape, dtype, src, tag))

    def send_array(self, array, dst, tag):
        data = np.ascontiguousarray(array)     # sent as bytes: MPI has no float16
        self.wait(self.world.Issend([data, self.MPI.BYTE], dst, tag),
                  f"send (tag {tag}) to rank {dst}")

    def recv_array(self, shape, dtype, src, tag):
        data = np.empty(shape, WIRE_DTYPES[dtype])
        self.wait(self.world.Irecv([data, self.MPI.BYTE], src, tag),
                  f"receive (tag {tag}) from rank {src}")
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

    def __init__(self, device="GPU"):
        from mindspore.communication import GlobalComm, get_group_size, get_rank, init
        init()
        self.world = GlobalComm.WORLD_COMM_GROUP     # (after init(): at import, HCCL's name)
        self.rank, self.size = get_rank(), get_group_size()
        self.dtypes = set(NCCL_DTYPES if device == "GPU" else WIRE_DTYPES)
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


class Parts(tuple):
    """The spec of a tuple of tensors: one (shape, dtype) per element."""


def spec_of(value):
    """(shape, dtype) of a tensor; Parts of those of a tuple's elements."""
    if isinstance(value, tuple):
        return Parts(spec_of(v) for v in value)
    return tuple(value.shape), value.dtype


def tensors_in(value):
    """The tensors of `value`, nested tuples and lists flattened, in order."""
    if isinstance(value, (tuple, list)):
        return [t for part in value for t in tensors_in(part)]
    return [value] if isinstance(value, ms.Tensor) else []


def example(spec):
    """Ones of `spec`: what a stage's forward is first run on."""
    return tuple(map(example, spec)) if isinstance(spec, Parts) else ms.ops.ones(*spec)


def elements(spec):
    """A spec's (shape, dtype) per tensor: one for a tensor."""
    return list(spec) if isinstance(spec, Parts) else [spec]


def write_header(spec):
    """A spec as HEADER int32s: -1 (None), 0 (a tensor) or a tuple's length, then per
    tensor its rank, dtype index and dims."""
    body = [-1] if spec is None else [len(spec) if isinstance(spec, Parts) else 0]
    for shape, dtype in elements(spec) if spec is not None else []:
        body += [len(shape), DTYPES.index(dtype), *shape]
    if len(body) > HEADER:
        raise ValueError(f"a stage boundary carries {spec}: too many tensors for its header")
    return np.array(body + [-1] * (HEADER - len(body)), np.int32)


def read_header(header):
    parts, k = [], 1
    for _ in range(max(1, header[0])):
        shape = tuple(int(d) for d in header[k + 2:k + 2 + header[k]])
        parts.append((shape, DTYPES[int(header[k + 1])]))
        k += 2 + header[k]
    return None if header[0] < 0 else Parts(parts) if header[0] else parts[0]


class PointToPoint:
    """One rank's messages: its wire, its pipeline's ranks by stage, and `specs[b]` crossing
    into virtual stage b."""

    def __init__(self, wire, pipeline_ranks, specs):
        self.wire, self.ranks, self.specs = wire, pipeline_ranks, specs


def sum_over(wire, grads, ranks):
    """Each gradient summed over `ranks`, as one flat message."""
    if len(ranks) == 1 or not grads:
        return tuple(grads)
    flat = wire.all_reduce(ms.ops.cat([g.reshape(-1) for g in grads]), ranks)
    pieces = ms.ops.split(flat, [g.size for g in grads])
    return tuple(p.reshape(g.shape) for g, p in zip(grads, pieces))


def every_rank(wire, row):
    """Every rank's `row` of integers, as rows of a matrix (rank r's is row r): one all-reduce
    of a matrix that is zero but for this rank's row."""
    rows = np.zeros((wire.size, len(row)), np.int32)
    rows[wire.rank] = row
    return wire.all_reduce(ms.Tensor(rows), tuple(range(wire.size))).asnumpy()
