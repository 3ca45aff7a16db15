"""The synchronizer role: when weights move (``policy``), how (``weights``: a torch.distributed
broadcast; or a checkpoint folder), the trainer/explorer ends (``client``) and the process
that publishes the plan and referees timeouts (``main``)."""
