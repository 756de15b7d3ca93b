"""INT8: post-training quantization of an ONNX export (ptq.py), quantization-aware training (qat.py), and the
calibration images both read (calibration.py). docs/deployment.md says how to use them."""
