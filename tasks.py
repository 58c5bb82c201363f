"""This checkout as an ops repository: vigil's collection (what `vigil` runs) plus the
lab's tasks (`invoke lab.up|down|status`), which only a source checkout has.

An ops repo's own tasks.py is two lines: ``from vigil.tasks.collection import ns``.
Exit codes: vigil/exitcodes.py and docs/.
"""

from __future__ import annotations

import lab.tasks
from vigil.tasks.collection import ns

ns.add_collection(lab.tasks.ns)
