"""vigil's front door: assembles the Invoke collection. The tasks live in vigil/tasks/
(one module per family: deploy, verify, runtime) and the lab's in lab/tasks.py; each
parses its flags, makes one library call and reports.

Config layers (Invoke): defaults < invoke.yaml < ~/.invoke.yaml < INVOKE_VIGIL_* env
< flags. Exit codes are documented in README.md and vigil/exitcodes.py.
"""

from __future__ import annotations

from invoke.collection import Collection

import lab.tasks
from vigil.tasks import deploy, group, runtime, verify

ns = Collection(deploy.deploy, deploy.render, deploy.status, deploy.logs, deploy.rollback,
                verify.verify, verify.history, verify.replay)
ns.add_collection(lab.tasks.ns)
ns.add_task(runtime.preflight)
ns.add_collection(runtime.stack)
ns.add_collection(group.ns)
ns.configure({"vigil": {"inventory": "inventory", "roles": "roles",
                        "templates": "roles/service/templates", "state_dir": "state",
                        # poll_s None: each host's own (roles/verify/defaults.yml)
                        "poll_s": None, "history_min_samples": 3}})
