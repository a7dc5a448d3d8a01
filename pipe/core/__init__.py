"""pipe.core: pipeline-parallel training in six short modules (docs/reading.md: in what order):

    config.py    what a run decides: stages, replicas, micro-batches, batch, schedule
    schedule.py  a schedule as data (GPipe, 1F1B), and `lower`, which adds the messages
    place.py     a rank's stage and its replica: D pipelines of P stages
    wire.py      send, receive and all-reduce, over MindSpore's NCCL/HCCL ops or mpi4py
    chunk.py     a model chunk: forward keeping each layer's input, backward layer by layer
    engine.py    one step: cut the batch, run the actions, sum over replicas, step

pipe's full engine (pipe/engine.py) writes its own step from these pieces, with every
feature as a line of it (docs/reading.md).
"""
