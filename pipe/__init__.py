"""pipe: pipeline-parallel training for MindSpore, small enough to read in one sitting.

Import what you need from the module that owns it (one idea per module):

    from pipe.config import PipelineConfig                     # everything a run decides
    from pipe.engine import PipelineEngine                     # train_step, predict, save
    from pipe.schedule import SCHEDULES, lower                 # schedules as data
    from pipe.simulator import simulate, format_table          # check and time them

(Nothing is imported here, so `python -m pipe` runs cleanly.)
"""
