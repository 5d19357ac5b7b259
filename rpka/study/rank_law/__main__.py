"""``python -m rpka.study.rank_law``: the same command as ``python -m rpka rank-law``."""

import sys

from rpka.study.rank_law.command import main

sys.exit(main())
