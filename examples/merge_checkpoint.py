"""Merge a step directory's virtual-stage-*.ckpt files into DIR/model.ckpt, the unsplit model.

    python examples/merge_checkpoint.py DIR"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # examples/cli.py
from cli import Parser  # noqa: E402


def main(argv=None):
    parser = Parser(prog="python examples/merge_checkpoint.py", description=__doc__.split("\n")[0])
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    from pipe.ops.checkpoint import CheckpointError, merge   # (MindSpore loads after the flags)
    try:
        print(f"wrote {merge(args.directory)}")
    except CheckpointError as e:        # one line naming the value and the fix, exit code 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
