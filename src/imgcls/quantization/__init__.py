"""INT8 of the network itself: quantization-aware training (qat.py, placement.py) and the calibration images it
and export's format=int8 (export/int8.py) read (calibration.py). docs/deployment.md says how to use them."""
