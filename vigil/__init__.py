"""vigil: deploy vLLM as systemd services and verify that they came up."""

from importlib import metadata

# The name it is installed by (pyproject.toml's project.name); the import package and
# the command are `vigil`, but "vigil" on the package index is someone else's project.
DISTRIBUTION = "vigil-vllm"

try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0.0.0+source"
