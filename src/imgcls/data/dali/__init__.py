"""The dali_cpu / dali_gpu data backends (NVIDIA DALI): backend.py (the backend and why its loader is
hand-written), pipelines.py (the DALI graphs), loader.py (the Lightning-facing loader), file_list.py (the
reader's file list), host_resize.py (dali_cpu's torch resize and its reused batch buffers). Importing this
package does not import DALI; backend.py does."""
