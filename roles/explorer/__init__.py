"""The explorer role: workflows on rollout engines -> experience groups on the bus.

Read :mod:`roles.explorer.main` for the loop; engines live in ``engines/``, workflows in
``workflows/``, the runner pool (timeouts, retries, groups) in :mod:`roles.explorer.runner`.
"""
