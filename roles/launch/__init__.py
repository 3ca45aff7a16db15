"""Starting a run: ``trinity run``'s stage loop and supervisor (``run``, ``stages``), one owner per
run (``owner``), the job's ``run.json`` (``runrecord``) and the preflight checks of every entry
point (``checks``). Above the roles, which it starts; below the tools built on it."""
