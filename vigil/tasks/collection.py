"""vigil's Invoke collection: every task, as the ``vigil`` command and an ops repo's own
two-line ``tasks.py`` (``from vigil.tasks.collection import ns``) both run it.

Settings live under the ``vigil`` key; None means "the project file's, else the
default" (vigil/tasks/project.py), and keeps ``INVOKE_VIGIL_<KEY>`` working (Invoke only
reads environment variables for keys it knows).
"""

from __future__ import annotations

from invoke.collection import Collection

from vigil.tasks import deploy, group, init, lock, runtime, verify
from vigil.tasks.project import DEFAULTS

ns = Collection(deploy.deploy, deploy.render, deploy.status, deploy.logs, deploy.rollback,
                verify.verify, verify.history, verify.replay, init.init)
ns.add_task(runtime.preflight)
runtime.stack.add_task(lock.lock)
ns.add_collection(runtime.stack)
ns.add_collection(group.ns)
ns.configure({"vigil": dict.fromkeys(DEFAULTS)})
