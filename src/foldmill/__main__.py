import sys

from foldmill.cli import main

sys.exit(main())
