"""The dali_cpu / dali_gpu data backends (NVIDIA DALI): backend.py (the backend and why its loader is
hand-written), pipelines.py (the DALI graphs), loader.py (the Lightning-facing loader over DALI's iterator),
thread_executor.py (the loader's one background thread), records.py
(the shard readers' keys), host_resize.py (dali_cpu's torch resize), batch_ring.py (the batch buffers it
writes into). Importing this package does not import DALI; backend.py does."""
