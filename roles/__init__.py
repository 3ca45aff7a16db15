"""The processes (explorer, buffer, trainer, synchronizer), what launches them and what they share.

Six floors, each importing only its own floor and those below (``tests/test_imports.py``):

1. ``cli``: the ``trinity`` command line, one subcommand each;
2. ``tools/``: what is built on runs: the studio, LoRA sweeps, the generated reference pages;
3. ``launch/``: ``trinity run`` (the stage loop, the supervisor, run locks, ``run.json``) and
   the preflight checks every entry point runs before anything starts;
4. the four roles, ``explorer/``, ``buffer/``, ``trainer/``, ``synchronizer/``, none
   importing another: they talk over the bus;
5. ``weightsync/``: how weights move from trainer to explorer, the library both ends run
   (when: ``client``; how: a sender/receiver pair per ``sync_method``);
6. ``runtime/``: what every role process uses: its configuration, logs, metrics, signals,
   device plan, plugins and the cut-offs that end a run that cannot succeed.

``compat/trinity`` (Trinity-RFT's plugin API, installed as ``trinity``) sits above them all.
A role's main loop should read in one sitting; engines, workflows and other moving parts live
one folder down.
"""
