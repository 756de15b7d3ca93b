"""What one training step is made of: the LightningModule (module.py), optimizer, LR schedule, precision, sync BN,
EMA, mixup, step timing, and the checkpoint policy (paths, atomic writer, which checkpoint a run resumes from)."""
