"""The engine: the stage contract, the runner, settings validation, cache keys and the local and remote stage caches."""
