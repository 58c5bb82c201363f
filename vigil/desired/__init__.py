"""Desired state: inventory, profiles, stacks, roles, rendered files, resolved targets."""
