"""The config layer: composing conf/ (compose.py), checking every key (checks.py, overrides.py), the names a check
needs without torch (choices.py), the hardware profiles (hardware.py), NVIDIA's published runs (published.py) and
the generated key reference (reference.py). Imports nothing above imgcls's base modules."""
