"""What every role process uses and no role owns: its configuration (``config``), its handles
on the bus and its heartbeat (``role``), user plugins, logs, metrics (``monitor``), SIGTERM and
orphans (``signals``), the device plan (``placement``), hub ids in paths (``hub_paths``), CPU
thread sharing (``cpu_tuning``) and the cut-offs that end a run that cannot succeed
(``verdicts``). The bottom floor of ``roles``: it imports no floor above it."""
