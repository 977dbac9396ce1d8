"""The project's Optuna sweeper as a Hydra plugin (``hydra/sweeper=optuna``; config in
``conf/hydra/sweeper/optuna.yaml``). ``hydra_plugins`` is a namespace package: Hydra finds this
package on ``sys.path`` (the project folder, or the installed project) and imports it at start, so
this package imports nothing heavy until a sweep runs."""
