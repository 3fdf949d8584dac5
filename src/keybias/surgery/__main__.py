import sys

from keybias.surgery.cli import main

sys.exit(main())
