"""A run of a command: train and evaluate, their plan, run dir, Trainer, loggers, log files and sweep results."""
