"""Train an image classifier: `python train.py model=resnet50 precision=amp hardware=dgxa100 recipe=90e`.

Thin entry point; the work happens in imgcls.run.train.run (configs in conf/).
"""

from imgcls.cli import train_main

if __name__ == "__main__":
    train_main()
