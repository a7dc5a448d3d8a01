"""Runs several training configurations inside one `mpiexec` launch.

    mpiexec -n 8 python tests/mpi_worker.py '[[4, ["--stages", "4", "--save", "/tmp/a"]], ...]'

Each configuration trains on the first P x D processes (an MPI sub-communicator); the
others wait. Starting MindSpore once per process instead of once per configuration keeps
the transparency matrix within CI's time.
"""
import json
import os
import sys
import time

from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "mnist"))
import train  # noqa: E402
from pipe.comm import MpiWire  # noqa: E402

world = MPI.COMM_WORLD
for ranks, flags in json.loads(sys.argv[1]):
    sub = world.Split(0 if world.Get_rank() < ranks else MPI.UNDEFINED, world.Get_rank())
    if sub != MPI.COMM_NULL:
        train.train(train.parse_args([str(f) for f in flags]), MpiWire(60.0, sub))
        sub.Free()
    done = world.Ibarrier()
    while not done.Test():      # idle ranks sleep instead of spinning on the 2 CI cores
        time.sleep(0.01)
