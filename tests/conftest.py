"""The shared launch: every test module's training runs in ONE mpiexec launch.

Each module that checks trained weights lists its runs (`matrix(root)`: [(ranks,
configuration)], each saving under root); tests/mpi_worker.py runs them all, each process
starting MindSpore once for all of them. The launch starts as soon as the tests are
collected and trains while the tests that need none of it run (most of them start
a process or two and leave a core idle); then come the tests that read its results
(`trained`), and last those marked `alone`, whose deadlines of a second or a few want
the CPU to themselves.
"""
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import start_many  # noqa: E402

LAUNCH = {}          # "job": the shared launch under way, "root": where it saves


def needs_launch(item):
    return "trained" in item.fixturenames


def pytest_collection_modifyitems(items):
    """Beside the launch first, then what reads it, then what runs alone (stable: file order)."""
    items.sort(key=lambda item: 2 if item.get_closest_marker("alone") else int(needs_launch(item)))


def pytest_collection_finish(session):
    modules = {item.module for item in session.items if needs_launch(item)}
    if not modules:
        return
    root = LAUNCH["root"] = tempfile.mkdtemp(prefix="pipe-trained-")
    configs = [c for module in sorted(modules, key=lambda m: m.__name__)
               for c in module.matrix(pathlib.Path(root))]
    LAUNCH["job"] = start_many(configs, world=4)   # (4 ranks on 2 cores: one pipeline's
                                                    # waits are another's compute; 8 were slower)


def pytest_sessionfinish():
    if "job" in LAUNCH:
        LAUNCH["job"].stop()
        shutil.rmtree(LAUNCH["root"], ignore_errors=True)


@pytest.fixture(scope="session")
def trained():
    """The root under which the shared launch saved each run, once it has ended well."""
    done = LAUNCH["job"].wait(900)
    assert done.returncode == 0, done.stderr[-3000:]
    return pathlib.Path(LAUNCH["root"])
