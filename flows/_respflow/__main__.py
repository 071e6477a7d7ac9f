"""``python -m respflow …`` is ``respflow …``."""

import sys

from respflow.flows._cli import main

sys.exit(main())
