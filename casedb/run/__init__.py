"""Running cases: the run's spec, its plan, the target backend, executing one case, the run loop, its console."""
