"""``python -m graphc ...`` is the ``graphc`` command."""

import sys

from graphc.cli.main import main

sys.exit(main())
