"""benchmarks/timing.py: its turns (processes compile side by side, and are timed one at a
time) and what the benchmark reads from a recorded step."""
import os
import sys
import threading
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from timing import host_costs, turn  # noqa: E402


def test_a_process_is_timed_only_after_the_one_before_it_ends(tmp_path):
    args = SimpleNamespace(turns=str(tmp_path), turn=1, of=0)
    with turn(args) as wait:
        waiting = threading.Thread(target=wait)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()                  # process 0 has not ended
        (tmp_path / "0").touch()
        waiting.join(60)                           # (returns as soon as it is done)
        assert not waiting.is_alive()
        assert not (tmp_path / "1").exists()
    assert (tmp_path / "1").exists()               # the next one's turn


def test_no_process_is_timed_before_every_one_of_its_batch_is_ready(tmp_path):
    """The first turn waits for the batch's last compile: none is timed beside a compile."""
    with turn(SimpleNamespace(turns=str(tmp_path), turn=0, of=2)) as wait:
        waiting = threading.Thread(target=wait)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and (tmp_path / "ready-0").exists()   # process 1 compiles
        (tmp_path / "ready-1").touch()
        waiting.join(60)
        assert not waiting.is_alive()


def test_a_failed_process_still_hands_on_its_turn(tmp_path):
    with pytest.raises(RuntimeError):
        with turn(SimpleNamespace(turns=str(tmp_path), turn=0, of=2)):
            raise RuntimeError("did not compile")
    assert (tmp_path / "0").exists() and (tmp_path / "ready-0").exists()


def test_without_turns_nothing_waits_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with turn(SimpleNamespace(turns=None, turn=3, of=4)) as wait:
        wait()
    assert os.listdir(tmp_path) == []


def test_host_costs_are_medians_per_action_kind():
    spans = [("F0", 300), ("F1", 100), ("F2", 200), ("sB1:1", 40), ("sB0:1", 60), ("optimizer", 900)]
    events = [{"name": name, "dur": dur} for name, dur in spans]
    assert host_costs(events) == {"F": 200, "sB": 50, "optimizer": 900}
