"""The front door: thin Invoke tasks (parse flags, one library call, report)."""
