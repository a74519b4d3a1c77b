"""`python -m posttrain.cli` runs the console command."""

import sys

from posttrain.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
