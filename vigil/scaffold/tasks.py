# `invoke deploy` / `invoke verify` here run vigil's tasks (the same as `vigil deploy`).
from vigil.tasks.collection import ns  # noqa: F401
