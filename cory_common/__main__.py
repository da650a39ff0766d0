"""`python -m cory_common`: which other installed packages use this project's top-level names."""

import sys
import warnings

from cory_common.packages import PackageClash, report

warnings.simplefilter("ignore", PackageClash)  # said below, with the installed distributions
sys.exit(report())
