"""pipe: pipeline-parallel training for MindSpore, small enough to read in one sitting.

docs/reading.md gives the reading order: the runtime is this folder, `features/` what is
called at a visible line of the step, `ops/` what runs around it, `fast/` the step as one
graph and pipe's choices. Import from the module that owns each name (nothing is imported
here, so `python -m pipe` runs cleanly):

    from pipe.config import PipelineConfig
    from pipe.engine import PipelineEngine
    from pipe.schedules import SCHEDULES, make_schedule"""
