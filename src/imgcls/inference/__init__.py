"""Trained networks as a user runs them: from any weights file (trained.py, QAT ones through quantization.qat) or
an ONNX export (onnx_model.py), with their classes and preprocessing. Above models/ and quantization/, which it
joins."""
