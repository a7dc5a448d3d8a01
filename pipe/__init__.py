"""pipe: pipeline-parallel training for MindSpore, small enough to read in one sitting.

Learn it from pipe.core (the runtime, read in the order its docstring gives); use it
through the engine with every feature. Import from the module that owns each name:

    from pipe.config import PipelineConfig                     # everything a run decides
    from pipe.engine import PipelineEngine                     # train_step, predict, save
    from pipe.schedules import SCHEDULES, make_schedule        # schedules as data
    from pipe.simulator import simulate, format_table          # check and time them

(Nothing is imported here, so `python -m pipe` runs cleanly.)
"""
