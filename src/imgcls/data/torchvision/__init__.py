"""The torchvision data backend: PIL decoding and torchvision/timm transforms in DataLoader worker processes,
over a class folder or shard files (data.format), each rank's samples chosen by a resumable sampler."""
