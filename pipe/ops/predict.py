"""Forward-only pipelining: the model's outputs on a batch, or its loss, every micro-batch
through each chunk in turn with the layers in eval mode (no dropout, batch norm from its
statistics)."""
from dataclasses import replace

import mindspore as ms
from mindspore import ops

from pipe.actions import Loop
from pipe.batch import MicroBatches, as_tensor
from pipe.ops.watchdog import alike
from pipe.schedule import Action, lower

__all__ = ["forward_only", "split_for_predict", "outputs", "predict", "evaluate", "Predicting"]


def forward_only(schedule):
    """`schedule`'s placement, lowered, with only forwards: GPipe's first half."""
    P, M, v = schedule.stages, schedule.micro_batches, schedule.chunks_per_stage
    F = [Action("F", m, c) for c in range(v) for m in range(M)]
    return lower(type(schedule)("forward-only", P, M, [list(F) for _ in range(P)], v))


class Predicting(Loop):
    """The training step's handlers with F as predict's: eval mode, keeping nothing."""

    def __init__(self, layout, p2p, around):
        super().__init__(layout, p2p, None, around)
        self.chunks = layout.chunks

    def forward(self, state, mb, c, takes, puts, data):
        out = self.chunks[c].infer(self.arrived(state, data[0], mb, takes))
        return self.hand_on(state, c, puts, out, out)


def split_for_predict(config, inputs):
    """The whole of `inputs` in M micro-batches, on every replica; no labels."""
    M = config.micro_batches
    if len(inputs) % M:
        raise ValueError(f"{len(inputs)} inputs do not divide into micro_batches={M}: pass "
                         f"predict or evaluate a multiple of {M} rows")
    size = len(inputs) // M
    return MicroBatches((inputs, None),
                        [slice(m * size, (m + 1) * size) for m in range(M)])


def outputs(engine, inputs):
    """The model's outputs on `inputs`, a tensor on the last stage (None elsewhere), every
    micro-batch through each chunk in eval mode; and this pipeline's ranks and output spec."""
    batch = split_for_predict(engine.config, inputs)
    schedule = engine.layout.forward_only
    if batch.shapes not in engine.predicting:        # agreed once per shape, in eval mode
        p2p = engine.agree_shapes(batch, training=False)
        layout = replace(engine.layout, schedule=schedule)
        actions = Predicting(layout, p2p, lambda i: engine.around(schedule, i))
        engine.predicting[batch.shapes] = actions, p2p, engine.output_spec
    actions, p2p, output_spec = engine.predicting[batch.shapes]
    for chunk in engine.chunks:
        chunk.set_mode(False)
    engine.watch.begin(schedule)
    state = actions.run_all(actions.start(), (batch.inputs,))
    engine.watch.end(schedule)
    return ops.cat(state["outputs"]) if engine.chunks[-1].is_last else None, p2p.ranks, output_spec


def predict(engine, inputs, broadcast=True):
    """`engine.predict`: the model's outputs on `inputs` as numpy, on every rank or
    (`broadcast` off) on the last stage alone, through the training step's handlers."""
    out, ranks, (shape, dtype) = outputs(engine, inputs)
    if not broadcast:
        return None if out is None else out.asnumpy()
    out = out if out is not None else ops.zeros((len(inputs),) + shape[1:], dtype)
    return engine.all_reduce("the broadcast of the outputs", out, ranks).asnumpy()


def evaluate(engine, inputs, labels):
    """`engine.evaluate`: the loss on (`inputs`, `labels`) in eval mode, on every rank, as one
    process's loss_fn(model(inputs), labels) (sum / count for a (sum, count) loss), DeepSpeed's
    eval_batch: the outputs stay on the last stage, one number travels; no weight moves."""
    if len(labels) != len(inputs):
        raise alike(ValueError(f"evaluate got {len(inputs)} inputs and {len(labels)} labels: "
                               "give one row of labels per row of inputs"))
    out, loss = outputs(engine, inputs)[0], ops.zeros(1, ms.float32)
    if out is not None and engine.replica == 0:          # (every replica ran the whole batch)
        loss = engine.loss_fn(out, as_tensor(labels))    # (fp16's logits: float32 already)
        loss = (loss[0] / loss[1] if isinstance(loss, tuple) else loss).reshape(1)
    return float(engine.all_reduce("the evaluation's loss", loss, engine.all_ranks).asnumpy()[0])
