"""`python -m posttrain.cli` runs the console command."""

import sys

from posttrain.cli.main import main

sys.exit(main())
