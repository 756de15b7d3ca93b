"""Data: ImageFolder discovery, transforms, samplers, backends and the LightningDataModule."""
