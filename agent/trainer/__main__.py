"""``python -m agent.trainer run -- CMD ARGS...``: the launcher (agent/trainer/launcher.py)."""

import sys

from agent.trainer.launcher import main

sys.exit(main())
