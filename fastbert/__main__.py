"""`python -m fastbert ...` is the same as the `fastbert` console script."""
import sys

from fastbert.cli import main

sys.exit(main())
