"""Host cost of PyNative ops.Send / ops.Receive between 2 GPUs, and whether they block.

    msrun --worker_num=2 --local_worker_num=2 --join=True benchmarks/probes/send_cost.py

Rank 0 sends, rank 1 receives. Prints each rank's median host microseconds per message
with the peer ready, the time to issue a message whose peer comes 500 ms late (a blocking
call would take the 500 ms), and a send issued right after a compiled call (benchmarks/log.md,
section 7).
"""
import statistics
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import GlobalComm, get_rank, init


def median_us(call, n=50):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


class Dense(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(1024, 1024)

    @ms.jit
    def construct(self, x):
        return self.dense(x)


def main():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("GPU")
    init()
    rank, group = get_rank(), GlobalComm.WORLD_COMM_GROUP
    barrier = lambda: ops.AllReduce(group=group)(ms.Tensor([1.0])).asnumpy()
    for rows in (64, 1024):
        x = ms.Tensor(np.ones((rows, 1024), np.float32))
        send, recv = ops.Send(rows, 1, group=group), ops.Receive(rows, 0, [rows, 1024], ms.float32, group=group)
        message = (lambda: send(x)) if rank == 0 else recv
        for _ in range(5):
            message()
        ms.runtime.synchronize()
        barrier()
        print(f"rank {rank}, {rows} x 1024: {median_us(message):.0f} us per "
              f"{'send' if rank == 0 else 'receive'} (peer ready)", flush=True)
        ms.runtime.synchronize()
        barrier()
        for late in (1, 0):              # first the receiver is late, then the sender
            if rank == late:
                time.sleep(0.5)
                message()
            else:
                start = time.perf_counter()
                message()
                print(f"rank {rank}, {rows} x 1024: issued in {(time.perf_counter() - start) * 1e3:.2f} ms "
                      "with the peer 500 ms late", flush=True)
            ms.runtime.synchronize()
            barrier()
    dense, x = Dense(), ms.Tensor(np.ones((64, 1024), np.float32))
    send, recv = ops.Send(7, 1, group=group), ops.Receive(7, 0, [64, 1024], ms.float32, group=group)
    forward, sends = [], []
    for i in range(55):
        if rank == 0:
            start = time.perf_counter()
            y = dense(x)
            middle = time.perf_counter()
            send(y)
            forward.append(middle - start)
            sends.append(time.perf_counter() - middle)
        else:
            recv()
    ms.runtime.synchronize()
    barrier()
    if rank == 0:
        print(f"rank 0: compiled Dense {statistics.median(forward[5:]) * 1e6:.0f} us, then its send "
              f"{statistics.median(sends[5:]) * 1e6:.0f} us (host)", flush=True)


if __name__ == "__main__":
    main()
