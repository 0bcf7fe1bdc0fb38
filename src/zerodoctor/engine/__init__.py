"""Running the real DeepSpeed engine on a tiny model (for `selftest` and the tests). Nothing here is imported
by the fast commands: torch, DeepSpeed and transformers load only inside the worker process."""
