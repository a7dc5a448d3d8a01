"""The shared launch: every test module's training runs in ONE mpiexec launch.

Each module that checks trained weights lists its runs (`matrix(root)`: [(ranks,
configuration)], each saving under root); tests/mpi_worker.py runs them all, each process
starting MindSpore once for all of them. The launch starts as soon as the tests are
collected and trains while the tests that need none of it run (most of them start
a process or two and leave a core idle); then come the tests that read its results
(`trained`), each module as soon as its own runs have ended, while the launch goes on with
the next modules'; last, once the launch is over, those marked `alone`, whose deadlines of a
second or a few want the CPU to themselves.
"""
import os
import pathlib
import shutil
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_report import CpuReport  # noqa: E402
from launch import start_many  # noqa: E402

LAUNCH = {}   # "job": the shared launch, "root": where it saves, "runs": {module: its configurations' places}


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the tests marked slow (minutes each: not in CI's suite)")
    parser.addoption("--cpu-report", action="store_true",
                     help="say where the CPU time went (tests/cpu_report.py)")


def pytest_configure(config):
    if config.getoption("--cpu-report"):
        config.pluginmanager.register(CpuReport(LAUNCH), "cpu_report")


def needs_launch(item):
    return "trained" in item.fixturenames


def pytest_collection_modifyitems(config, items):
    """Beside the launch first, then what reads it, then what runs alone (stable: file order,
    the order in which the launch trains each module's runs). Those marked slow only with
    --slow."""
    if not config.getoption("--slow"):
        skip = pytest.mark.skip(reason="slow: minutes of compiling; run with --slow")
        for item in items:
            if item.get_closest_marker("slow"):
                item.add_marker(skip)
    items.sort(key=lambda item: 2 if item.get_closest_marker("alone") else int(needs_launch(item)))


def pytest_collection_finish(session):
    modules = sorted({item.module for item in session.items if needs_launch(item)}, key=lambda m: m.__name__)
    if not modules:
        return
    root = pathlib.Path(tempfile.mkdtemp(prefix="pipe-trained-"))
    (root / "ended").mkdir()
    configs, LAUNCH["root"], LAUNCH["runs"] = [], root, {}
    for module in modules:
        runs = module.matrix(root)
        LAUNCH["runs"][module.__name__] = range(len(configs), len(configs) + len(runs))
        configs += runs
    LAUNCH["job"] = start_many(configs, world=4, ended=root / "ended")   # (4 ranks on 2 cores:
                                                    # one pipeline's waits are another's compute; 8 were slower)


def launch_over(timeout):
    """The launch, once it has ended (read once: a Job's logs are gone after `wait`)."""
    if "over" not in LAUNCH:
        LAUNCH["over"] = LAUNCH["job"].wait(timeout)
    return LAUNCH["over"]


def pytest_runtest_setup(item):
    if item.get_closest_marker("alone") and "job" in LAUNCH:
        launch_over(900)


def pytest_sessionfinish():
    if "job" in LAUNCH:
        LAUNCH["job"].stop()
        shutil.rmtree(LAUNCH["root"], ignore_errors=True)


@pytest.fixture(scope="module")
def trained(request):
    """The root under which the shared launch saved each run, once this module's runs have
    all ended well."""
    ended, deadline = LAUNCH["root"] / "ended", time.monotonic() + 900
    while not all((ended / str(i)).exists() for i in LAUNCH["runs"][request.module.__name__]):
        if LAUNCH["job"].proc.poll() is not None:
            over = launch_over(0)
            assert over.returncode == 0, over.stderr[-3000:]
            raise AssertionError(f"the launch ended without {request.module.__name__}'s runs")
        assert time.monotonic() < deadline, "the shared launch ran past 900 s"
        time.sleep(0.2)
    return LAUNCH["root"]
