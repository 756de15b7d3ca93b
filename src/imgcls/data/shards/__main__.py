"""`python -m imgcls.data.shards COMMAND ...`, the shard tools (docs/shards.md):

    convert SRC DST format=webdataset|tfrecord shard_size=N [seed=0]   an ImageFolder into shards (convert.py)
    cache [list] [--dir DIR]                                            what data.shard_cache holds (cache.py)
    cache prune [--max-size SIZE] [--older-than DAYS] [--dir DIR]       its least recently used entries removed

A user's mistake is one line `imgcls: error: ...` and exit code 2, as imgcls.cli.fail prints it (importing
imgcls.cli, Hydra and Lightning, would make every mistake take seconds).
"""

from __future__ import annotations

import sys

from imgcls.errors import ConfigError, UserError

COMMANDS = ("convert", "cache")
USAGE = "python -m imgcls.data.shards convert SRC DST format=... shard_size=N | cache [list|prune] ..."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if not argv or argv[0] not in COMMANDS:
            given = f"COMMAND={argv[0]} is not allowed" if argv else "COMMAND is not set"
            raise ConfigError(f"{given}; allowed: {', '.join(COMMANDS)} (usage: {USAGE})")
        if argv[0] == "convert":
            from imgcls.data.shards.convert import main as command
        else:
            from imgcls.data.shards.cache import main as command
        return command(argv[1:])
    except UserError as exc:
        print(f"imgcls: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
