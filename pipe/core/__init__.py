"""pipe.core: pipeline-parallel training in six short modules. Read them in this order:

    config.py    what a run decides: stages, replicas, micro-batches, batch size, schedule
    schedule.py  a schedule as data (GPipe, 1F1B), and `lower`, which adds the messages
    place.py     a rank's stage and replica, and its micro-batches of a step's batch
    wire.py      send, receive and all-reduce, over MindSpore's NCCL/HCCL ops or mpi4py
    chunk.py     a model chunk: forward keeping each layer's input, backward layer by layer
    engine.py    one step: cut the batch, run the actions, sum over replicas, step

Everything else in pipe is a feature that reaches these through named seams:
`Engine.build` (partitions, builders, more schedules), `Engine.connect_stages` (the shape
check), `Engine.around` (watchdog, trace), `Engine.run_step` (one graph per step),
`Engine.update_weights` (tied weights, clipping), `Engine.mean_loss` (batch norm's
statistics, NaN), `Engine.handlers` (the I and W of split backwards); `Chunk.keeps`, `Chunk.layer_grad`, `Chunk.extras`, `Chunk.kept` and
`Chunk.restored` (dropout, ReLU, recompute); `MpiWire.wait` (deadlines).
docs/reading.md walks through it.
"""
