"""A weight shared by the first and last stage (tied embedding and output head) trains like
one process, its copies stay bitwise equal after every step, and the merged checkpoint
loads into the unsplit model with nothing left out (tests/tied_check.py, in the suite's
one launch: conftest.trained), here with two replicas; tied layer builders across two
stages: tests/test_gpt.py."""
from launch import results


def matrix(root):
    return [(4, {"model": "tied", "save": str(root / "tied-2x2"),
                 "config": {"stages": 2, "data_parallel": 2}})]


def test_tied_weights_train_like_one_process(trained):
    ranks = results(trained / "tied-2x2")
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, found in ranks.items():
        checks = {k: v for k, v in found.items() if k not in ("buffers", "cpu_seconds")}  # (mpi_worker's)
        assert checks == {
            "losses": True, "copies": True, "table": True, "loads": True, "names": True,
            "merged": True}, rank
