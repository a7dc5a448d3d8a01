"""pipe.core: pipeline-parallel training in six short modules. Read them in this order:

    config.py    what a run decides: stages, replicas, micro-batches, batch, schedule, clip
    schedule.py  a schedule as data (GPipe, 1F1B), and `lower`, which adds the messages
    place.py     a rank's stage and its replica: D pipelines of P stages
    wire.py      send, receive and all-reduce, over MindSpore's NCCL/HCCL ops or mpi4py
    chunk.py     a model chunk: forward keeping each layer's input, backward layer by layer
    engine.py    one step: cut the batch, run the actions, sum over replicas, clip, step

Every other feature of pipe overrides seams (docs/reading.md): Engine's `build`, `around`,
`connect_stages`, `micro_batches`, `run_step`, `reduce`, `update_weights`, `mean_loss`,
`handlers`; Chunk's `keeps`, `layer_grad`, `extras`, `kept`, `restored`; MpiWire's `wait`.
"""
