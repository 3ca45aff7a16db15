"""What flows and how it is configured: data types, the msgpack codec, and settings.

``schemas`` imports nothing else from trinity, so every other package may depend on it. It
defines the messages (Task, Experience, ExperienceGroup, SyncEvent, Metric), a pickle-free
msgpack codec for them (tensors travel as raw bytes + dtype + shape), and the pydantic-settings
configuration that mirrors Trinity-RFT's config names.
"""
