"""What every stratum of the engine leans on: the checkpoint loader, the run's settings, counts and
timings. Imports no other part of the engine."""
