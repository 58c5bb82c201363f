"""Reaching hosts: SSH or local transports, and calling the host agent."""
