"""``trinity``: Trinity-RFT's plugin API, so a user's workflow, reward function and the FAQ's
scripts written for Trinity-RFT import and run here unchanged.

Thin adapters over this project's own classes, never a second implementation: a workflow
registered with ``WORKFLOWS.register_module`` runs inside our explorer's runner (through
:class:`trinity.common.workflows.workflow.UpstreamWorkflow`), calling our rollout engine
through :class:`trinity.common.models.model.ModelWrapper`; a reward registered with
``REWARD_FUNCTIONS.register_module`` becomes one of our reward functions (``ops.rewards``), so
our built-in workflows call it too. Plugins are found as before: the files in
``TRINITY_PLUGIN_DIRS`` (``roles/runtime/plugins.py``) or a ``module:attr`` name.

Where it lives: ``roles/compat/trinity`` (the project's top level is fixed), installed under
the import name ``trinity`` (``pyproject.toml``: ``packages.find.where``). Import it as
``trinity`` only. It sits above ``roles``: it imports ``roles``, ``ops`` and ``schemas``;
nothing of ours imports it (``tests/test_imports.py``).

What is here, and what is not yet: see ``docs/upstream.md`` ("The plugin API").
"""
