"""`python -m keybias` is the surgery tool, as `keybias-surgery` and `python -m keybias.surgery` are."""

import sys

from keybias._entry import main

sys.exit(main())
