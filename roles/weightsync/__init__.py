"""How weights move from the trainer to the explorer's engines, run by both ends.

``client``: when (each end's loop calls it: the plan, offers, waits and timeouts; ``policy``:
the pure functions of the step it asks); ``base``: how, as one :class:`~.base.Sender` (trainer)
and one :class:`~.base.Receiver` (explorer) per ``sync_method``: ``checkpoint`` (a Hugging
Face folder) and ``broadcast`` (``nccl``: a torch.distributed group, NCCL on GPU and gloo on
CPU, whose membership is ``states``' machines and whose tensors ``weights`` moves). The
synchronizer process (:mod:`roles.synchronizer`) only referees.
"""
