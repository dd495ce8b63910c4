import sys

from rcq.cli import main

sys.exit(main())
