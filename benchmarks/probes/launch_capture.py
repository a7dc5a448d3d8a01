"""Another probe's run with MindSpore's kernel launch capture on: the host's launches of a
compiled graph recorded once and replayed (`ms.runtime.set_kernel_launch_capture`,
experimental, documented for inference). A step bound by launching kernels (the small MLP
at M=1, the GPT at M=4: benchmarks/log.md sections 36 and 39) would run at its kernels'
speed if the replay works on this device; this says whether it does, and at what speed.

    python benchmarks/probes/launch_capture.py ab_small --rounds 5 --steps 50
    python benchmarks/probes/launch_capture.py wgrad_in_turn --precision fp16 --steps 20
"""
import importlib
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                    # probes/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # benchmarks/


def main(argv):
    if not argv or argv[0] not in ("ab_small", "wgrad_in_turn", "step_phases"):
        print("usage: launch_capture.py {ab_small,wgrad_in_turn,step_phases} [ITS FLAGS...]", file=sys.stderr)
        return 2
    probe = importlib.import_module(argv[0])
    ms.runtime.set_kernel_launch_capture(True)
    print("kernel launch capture on", flush=True)
    return probe.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
