"""pipe: pipeline-parallel training for MindSpore, small enough to read in one sitting."""
from pipe.engine import PipelineConfig, PipelineEngine
from pipe.schedule import SCHEDULES, Action, Schedule, lower
from pipe.simulator import Deadlock, checked_schedule, format_table, simulate
from pipe.topology import Topology

__all__ = ["PipelineConfig", "PipelineEngine", "SCHEDULES", "Action", "Schedule", "lower",
           "Deadlock", "checked_schedule", "format_table", "simulate", "Topology"]
