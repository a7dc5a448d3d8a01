"""Operations around the step: checkpoints, fail-fast, the first step's check, the simulator."""
