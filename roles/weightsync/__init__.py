"""How weights move from the trainer to the explorer's engines, run by both ends.

``policy``: when (pure functions of the step and ``sync_interval``); ``states``: the state
machines each end steps through, raising on an undeclared move; ``weights``: the tensors over a
torch.distributed group (NCCL on GPU, gloo on CPU) in buckets; ``client``: the trainer's and the
explorer's ends over the bus (offers, requests, rendezvous, checkpoint folders). The
synchronizer process (:mod:`roles.synchronizer`) only referees.
"""
