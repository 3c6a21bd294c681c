"""`python -m tally <verb>`: the same as the `tally` command."""
import sys

from tally.cli import main

sys.exit(main())
