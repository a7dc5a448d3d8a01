"""pipe: pipeline-parallel training for MindSpore, small enough to read in one sitting.

docs/reading.md gives the reading order. The runtime is this folder; `features/` holds
what wraps or is called at a visible line of the step, `ops/` what runs around it
(checkpoints, fail-fast, the check before the first step, the CLI, the simulator) and
`fast/` the step as one compiled graph and pipe's choice of modes. Import from the module
that owns each name:

    from pipe.config import PipelineConfig                     # everything a run decides
    from pipe.engine import PipelineEngine                     # train_step, predict, save
    from pipe.schedules import SCHEDULES, make_schedule        # schedules as data
    from pipe.ops.simulator import simulate, format_table      # check and time them

(Nothing is imported here, so `python -m pipe` runs cleanly.)
"""
