"""The `keybias-surgery` console script. It imports the tool inside `main`, so that a Ctrl-C
while torch and transformers load (the first second or two) ends like any other interrupted
run: one line, exit 130, nothing written."""

import sys


def main() -> int:
    try:
        from keybias.surgery.cli import main as run
    except KeyboardInterrupt:
        print("error: interrupted; nothing written", file=sys.stderr)
        return 130  # cli.EXIT_INTERRUPTED, which cannot be imported before torch has loaded
    return run()
