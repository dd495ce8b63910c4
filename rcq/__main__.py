"""``python -m rcq``: the ``rcq`` command (:mod:`rcq.cli`)."""

import sys

from rcq.cli import main

sys.exit(main())
