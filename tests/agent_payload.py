"""The host agent as the tests call it in-process: the joined script a host runs
(vigil/host/payload.py), one module, one namespace."""

from vigil.host import payload

agent = payload.load()
