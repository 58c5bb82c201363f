"""vigil: deploy vLLM as systemd services and verify that they came up."""

from importlib import metadata

try:
    __version__ = metadata.version("vigil")
except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0.0.0+source"
