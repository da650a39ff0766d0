"""Running training: the config, the trainer, checkpoints and restoring a saved run."""
