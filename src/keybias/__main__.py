"""`python -m keybias` is the surgery tool, as `keybias-surgery` and `python -m keybias.surgery` are."""

import sys

from keybias import _entry

sys.exit(_entry.main())
