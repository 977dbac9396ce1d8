"""The project's grid sweeper as a Hydra plugin (the default ``hydra/sweeper=grid``; config in
``conf/hydra/sweeper/grid.yaml``): Hydra's basic sweeper, ending in one line when a job's worker
process dies. Like the Optuna sweeper's package, this imports nothing heavy until a sweep runs."""
