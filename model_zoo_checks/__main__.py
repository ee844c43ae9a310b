"""``python -m model_zoo_checks``: the zoo regression run (see ``model_zoo_checks.run``).

OpenMP threads wait passively unless the environment says otherwise. Its default, spinning,
assumes the cores are free: with two threads on a two-core machine shared with other jobs, a
spinning thread keeps the core its partner needs, and a resnet50 forward took 0.8-2.8 s instead
of 0.1 s. The variable must be set before torch loads the OpenMP runtime, hence here.
"""

import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from model_zoo_checks.run import main  # after the OpenMP setting

sys.exit(main())
