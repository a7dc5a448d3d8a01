"""Features: each wraps a layer or is called at a visible line of the step (pipe.engine)."""
