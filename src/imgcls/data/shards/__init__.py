"""Sharded datasets (data.format=webdataset|tfrecord): formats, manifest, converter, remote copies, streaming.
docs/shards.md is the design."""
