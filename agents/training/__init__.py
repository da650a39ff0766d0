"""Running training: config, trainer, checkpoints, run log, CLI options, seed statistics."""
