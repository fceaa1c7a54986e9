"""``python -m fedwan_results show|plot FILE ...``."""

import sys

from . import main

sys.exit(main())
