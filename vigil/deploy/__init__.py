"""Deploy: facts -> preflight -> plan -> apply, per host."""
