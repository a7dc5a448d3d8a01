import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import run_many  # noqa: E402


@pytest.fixture(scope="session")
def trained(request, tmp_path_factory):
    """The training runs of every collected test module that lists some (`matrix(root)`:
    [(ranks, configuration)], each saving under root), in ONE mpiexec launch: each process
    starts MindSpore once for all of them (tests/mpi_worker.py). Returns root."""
    root = tmp_path_factory.mktemp("trained")
    modules = {item.module for item in request.session.items if hasattr(item.module, "matrix")}
    configs = [c for module in sorted(modules, key=lambda m: m.__name__) for c in module.matrix(root)]
    done = run_many(configs, world=8)   # (8 ranks on 2 cores: one pipeline's waits are
                                         # another's compute; 4 took 10% longer)
    assert done.returncode == 0, done.stderr[-3000:]
    return root
