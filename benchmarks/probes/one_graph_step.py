"""Probe (issue 12): a rank's whole GPipe step on 2 GPUs as ONE ms.jit graph, with
ops.Send / ops.Receive inside it. Small MLP 8 x 1024 (784 inputs), B=64, M=4, SGD.
    msrun --worker_num=2 --local_worker_num=2 --join=True benchmarks/probes/one_graph_step.py
Prints each rank's median step (ms) and the step-1 loss (rank 1). Recorded in
benchmarks/log.md, section 12: the evidence for generating such a graph from a rank's
action list."""
import statistics
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import GlobalComm, get_rank, init

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("GPU")
init()
rank, WORLD = get_rank(), GlobalComm.WORLD_COMM_GROUP
M, B, H = 4, 64, 1024
b = B // M
ms.set_seed(0)


def blocks(n_in, count):
    return [nn.SequentialCell([nn.Dense(n_in if i == 0 else H, H), nn.ReLU()])
            for i in range(count)]


class First(nn.Cell):
    def __init__(self):
        super().__init__()
        self.net = nn.SequentialCell(blocks(784, 4))
        self.weights = ms.ParameterTuple(self.net.trainable_params())
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.send = ops.Send(sr_tag=0, dest_rank=1, group=WORLD)
        self.recv = ops.Receive(sr_tag=1, src_rank=1, shape=[b, H], dtype=ms.float32, group=WORLD)

    @ms.jit
    def construct(self, x0, x1, x2, x3):
        xs = (x0, x1, x2, x3)
        token = x0
        for m in range(M):              # F, send: each after the previous one
            y = self.net(ops.depend(xs[m], token))
            token = ops.depend(y, self.send(y))
        g = self.recv(token)            # Receive's optional input orders it
        acc = self.grad(self.net, self.weights)(xs[0], g)
        for m in range(1, M):
            g = self.recv(acc[0])
            dw = self.grad(self.net, self.weights)(xs[m], g)
            acc = tuple(a + d for a, d in zip(acc, dw))
        for p, d in zip(self.weights, acc):
            ops.assign_sub(p, d * 0.001)
        return acc[0].sum()


class Last(nn.Cell):
    def __init__(self):
        super().__init__()
        self.net = nn.SequentialCell(blocks(H, 4) + [nn.Dense(H, 10)])
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.with_loss = nn.WithLossCell(self.net, self.loss)
        self.weights = ms.ParameterTuple(self.net.trainable_params())
        self.grad = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)
        self.send = ops.Send(sr_tag=1, dest_rank=0, group=WORLD)
        self.recv = ops.Receive(sr_tag=0, src_rank=0, shape=[b, H], dtype=ms.float32, group=WORLD)
        self.scale = ms.Tensor(1.0 / M, ms.float32)
        self.start = ms.Tensor(np.zeros((b, H), np.float32))   # Receive's ordering input: float32

    @ms.jit
    def construct(self, y0, y1, y2, y3):
        ys = (y0, y1, y2, y3)
        x = self.recv(self.start)
        xs = (x,)
        for m in range(1, M):
            x = self.recv(x)
            xs = xs + (x,)
        total = self.with_loss(xs[0], ys[0])
        (dx, _), acc = self.grad(self.with_loss, self.weights)(xs[0], ys[0], self.scale)
        token = ops.depend(dx, self.send(dx))
        for m in range(1, M):
            total = total + self.with_loss(ops.depend(xs[m], token), ys[m])
            (dx, _), dw = self.grad(self.with_loss, self.weights)(xs[m], ys[m], self.scale)
            dx = ops.depend(dx, token)
            token = ops.depend(dx, self.send(dx))
            acc = tuple(a + d for a, d in zip(acc, dw))
        for p, d in zip(self.weights, acc):
            ops.assign_sub(p, d * 0.001)
        return ops.depend(total / M, token)


rng = np.random.default_rng(0)
x = [ms.Tensor(rng.standard_normal((b, 784), np.float32)) for _ in range(M)]
y = [ms.Tensor(rng.integers(0, 10, b).astype(np.int32)) for _ in range(M)]
step = First() if rank == 0 else Last()
inputs = x if rank == 0 else y
times = []
for i in range(23):
    t = time.perf_counter()
    out = step(*inputs).asnumpy()
    times.append(time.perf_counter() - t)
    if i == 0:
        print(f"rank {rank}: step 1 output {out}", flush=True)
print(f"ONEGRAPH rank {rank}: median step {statistics.median(times[3:]) * 1e3:.2f} ms", flush=True)
