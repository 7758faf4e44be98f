"""``python -m torchrec_ascend.training`` (see :mod:`torchrec_ascend.training.cli`)."""

import sys

from .cli import main

sys.exit(main())
