"""Evaluate a checkpoint on the val split: `python evaluate.py ckpt=PATH`.

Thin entry point; the work happens in imgcls.run.evaluate.run (configs in conf/).
"""

from imgcls.cli import evaluate_main

if __name__ == "__main__":
    evaluate_main()
