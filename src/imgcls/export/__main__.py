"""`python -m imgcls.export ckpt=PATH format=...` (the command itself is in imgcls.cli)."""

from imgcls.cli import export_main

export_main()
