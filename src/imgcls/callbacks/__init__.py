"""Every Lightning callback of a training run (their order: order.py): report, epoch log and charts, console,
checkpoints, seeding, finite loss, preemption, bad images, W&B media."""
