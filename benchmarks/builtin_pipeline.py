"""MindSpore's own pipeline parallelism on the same MLP, for a side-by-side measurement.

GRAPH_MODE + SEMI_AUTO_PARALLEL: each block gets a `pipeline_stage`, the loss cell is
wrapped in `nn.PipelineCell` with M micro-batches, and `nn.PipelineGradReducer` (the
deprecated one: its 2.10 successor in mindspore.parallel.nn fails to compile) accumulates
the gradients. MindSpore then inserts the sends and receives itself. Needs GPU or Ascend
and `msrun`. With --stages 1 it is the plain compiled single-device training step, and
in fp16 on a GPU MindSpore's own mixed-precision recipe (`mixed_precision_step`).
"""
import mindspore as ms
from mindspore import nn, ops

__all__ = ["builtin_train_step", "mixed_precision_step", "set_parallel_context"]


def builtin_train_step(model, loss_fn, optimizer, stages, micro_batches, bounds):
    """A compiled `step(inputs, labels) -> loss`. Call before building nothing else: the
    parallel context must be set before the network is compiled."""
    net_with_loss = nn.WithLossCell(model, loss_fn)
    if stages == 1:
        grad_fn = ms.value_and_grad(net_with_loss, None, optimizer.parameters)

        @ms.jit
        def step(inputs, labels):
            loss, grads = grad_fn(inputs, labels)
            optimizer(grads)
            return loss
        return step
    for stage, (first, last) in enumerate(bounds):
        for i in range(first, last):
            model[i].pipeline_stage = stage
    pipeline = nn.PipelineCell(net_with_loss, micro_batches)
    pipeline.set_train()
    grad_fn = ops.value_and_grad(pipeline, None, optimizer.parameters)
    reducer = nn.PipelineGradReducer(optimizer.parameters)

    @ms.jit
    def step(inputs, labels):
        loss, grads = grad_fn(inputs, labels)
        optimizer(reducer(grads))
        return loss
    return step


def mixed_precision_step(model, loss_fn, optimizer, scale=2.0 ** 16):
    """MindSpore's own fp16 training step on one GPU, `mindspore.amp`'s level O2 (its GPU
    recommendation, what `level="auto"` picks there): float16 layers, batch norms and the
    loss in float32, a dynamic loss scale (started where pipe's starts; MindSpore's manager
    would start at 2**24) and the step skipped on an overflow. The same work as pipe's fp16,
    as one compiled graph in either mode: the training cell it builds, called as a Cell in
    PyNative mode, runs operator by operator; benchmark.py runs it in graph mode."""
    manager = ms.amp.DynamicLossScaleManager(scale, 2, 2000)
    cell = ms.amp.build_train_network(model, optimizer, loss_fn, level="O2", loss_scale_manager=manager)
    cell.set_train()

    @ms.jit
    def step(inputs, labels):
        return cell(inputs, labels)[0]
    return step


def set_parallel_context(stages, data_parallel):
    """Before init(): semi-automatic parallelism with `stages` pipeline stages (stand-alone
    graph mode on one device)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.reset_auto_parallel_context()
    if stages * data_parallel > 1:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL,
                                     pipeline_stages=stages, device_num=stages * data_parallel)
