"""The buffer role: experience pipeline, LMDB replay store and training batches over the bus.

``main.run_buffer`` is the process loop; ``service.BufferService`` the logic it drives;
``pipeline`` the operators and group advantages; ``files`` SFT/DPO datasets as experience;
the batch request/reply the trainer uses is :mod:`schemas.rpc`.
"""
