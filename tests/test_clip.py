"""Clipping by the global norm (pipe.batch) on one process (SoloWire); across ranks:
test_models.py, test_transparency.py."""
import mindspore as ms
import numpy as np

from pipe.features.clip import clip_by_global_norm
from pipe.wire import SoloWire


def test_clipping_counts_only_the_gradients_this_rank_owns():
    grads = (ms.Tensor(np.array([3.0, 4.0], np.float32)), ms.Tensor(np.array([12.0], np.float32)))
    clipped = clip_by_global_norm(SoloWire(), grads, [True, False], 1.0, (0,), 1)   # norm 5
    np.testing.assert_allclose(clipped[0].asnumpy(), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(clipped[1].asnumpy(), [2.4], rtol=1e-6)
    assert clip_by_global_norm(SoloWire(), grads, [True, False], 5.0, (0,), 1) is grads
