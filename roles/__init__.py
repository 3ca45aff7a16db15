"""The processes: explorer, buffer, trainer and synchronizer, and the ``trinity`` CLI.

Each role is a separate asyncio process that shares nothing with the others but the bus (and,
for weights, a torch.distributed group or a checkpoint directory). A role's main loop should
read in one sitting; engines, workflows and other moving parts live one folder down.
"""
