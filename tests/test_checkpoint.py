"""examples/merge_checkpoint.py, pipe.ops.checkpoint's merge as a command (the files it writes
and verifies: tests/test_reliability.py)."""
import pytest
from launch import load_example


def test_merge_of_a_directory_without_stages_is_one_line_and_exit_code_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        load_example("merge_checkpoint", "", "merge_checkpoint.py").main([str(tmp_path)])
    assert done.value.code == 2
    assert capsys.readouterr().err == (f"error: no virtual-stage-<v>.ckpt files in '{tmp_path}': point it "
                                       "at a step directory that PipelineEngine.save wrote\n")
