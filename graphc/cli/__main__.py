import sys

from graphc.cli.main import main

sys.exit(main())
