"""The explorer role: workflows on rollout engines -> experience groups on the bus.

Read :mod:`roles.explorer.main` for the role and its mode runners (``explore.py``,
``bench.py``, ``serve.py``, over what they share in ``core.py``); engines live in
``engines/``, workflows in ``workflows/``, the runner pool (timeouts, retries, groups) in
:mod:`roles.explorer.runner`.
"""
