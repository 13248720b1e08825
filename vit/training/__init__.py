"""Training: the LightningModule, optimizer, schedule, callbacks, guards, loggers, progress, a run's record."""
