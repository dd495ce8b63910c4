"""``python -m rcq.cli``: the ``rcq`` command.

Must not import: rcq.server, pysyncobj, lmdb.
"""

import sys

from rcq.cli import main

sys.exit(main())
