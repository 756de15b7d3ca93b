"""Sharded datasets (data.format=webdataset|tfrecord): formats, manifest, converter, remote copies, their cache,
streaming; `python -m imgcls.data.shards convert|cache` (__main__.py). A shard is a file of records; a rank's
part of the samples is not a shard (torchvision/samplers.RankSampler). docs/shards.md is the design."""
