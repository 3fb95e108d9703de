"""``python -m bench ARGS...``: the same as ``llmso bench ARGS...``."""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
