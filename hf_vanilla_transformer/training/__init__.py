"""Training: options and recipes, data, the Trainer and its callbacks, checkpoints and averaging, the run folder."""
