"""`python -m benchmarks.mechanism`: the command line of `benchmarks.mechanism.cli`."""

import sys

from benchmarks.mechanism.cli import main

sys.exit(main())
