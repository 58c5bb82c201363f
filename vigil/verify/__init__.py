"""Verify: phases, causes, reducer, budgets, history, watch, replay, report."""
