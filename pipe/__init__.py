"""pipe: pipeline-parallel training for MindSpore, small enough to read in one sitting.

docs/reading.md gives the reading order: the runtime is this folder, `features/` what is
called at a visible line of the step, `ops/` what runs around it. Import from the module
that owns each name:

    from pipe.config import PipelineConfig
    from pipe.engine import PipelineEngine
    from pipe.schedules import SCHEDULES, make_schedule"""
