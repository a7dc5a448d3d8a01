"""Where the suite's CPU time goes: `python -m pytest -q --cpu-report`.

The suite is bound by its CPU on CI's 2 cores (tests/README.md): its wall is about every
process's CPU time / 2, so a cut counts in CPU-seconds, not in a test's duration (which
depends on what runs beside it). After the tests this prints, per test module, the CPU
time of this process and of the processes its tests started and waited for, then the
shared launch's configurations by their CPU time (summed over their ranks, as
tests/mpi_worker.py records it in each rank's results).
"""
import glob
import json
import os
import resource
from collections import defaultdict

import pytest

SHOWN = 15                       # the launch's costliest configurations listed


def cpu_seconds(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class CpuReport:
    """A pytest plugin (tests/conftest.py registers it under --cpu-report). `launch`: the
    shared launch's state (conftest.LAUNCH), read once the tests have run."""

    def __init__(self, launch):
        self.launch, self.modules, self.configs = launch, defaultdict(lambda: [0.0, 0.0]), defaultdict(float)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        own, waited = cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
        yield
        spent = self.modules[item.nodeid.split("::")[0]]
        spent[0] += cpu_seconds(resource.RUSAGE_SELF) - own
        spent[1] += cpu_seconds(resource.RUSAGE_CHILDREN) - waited

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self):
        """Read the launch's results before conftest removes them."""
        root = self.launch.get("root")
        for path in glob.glob(str(root / "**" / "result-rank*.json"), recursive=True) if root else ():
            name = os.path.relpath(os.path.dirname(path), root)
            with open(path) as f:
                self.configs[name] += json.load(f).get("cpu_seconds", 0.0)

    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        write("CPU seconds per module: this process, the processes its tests waited for "
              "(the shared launch's counted where a test waited for its end)")
        for module, (own, waited) in sorted(self.modules.items(), key=lambda kv: -sum(kv[1])):
            write(f"  {own:7.1f} {waited:7.1f}  {module}")
        write(f"the shared launch: {sum(self.configs.values()):.1f} CPU seconds in "
              f"{len(self.configs)} configurations; the costliest:")
        for name, spent in sorted(self.configs.items(), key=lambda kv: -kv[1])[:SHOWN]:
            write(f"  {spent:7.1f}  {name}")
