"""`python -m imgcls.classify CKPT IMAGE...` or `ckpt=PATH images=[...]` (the command itself is in imgcls.cli)."""

from imgcls.cli import classify_main

classify_main()
