"""How messages flow: the only way trinity's roles talk to each other.

This package wraps nats-py around a real ``nats-server`` with JetStream: starting an embedded
server, connecting with auth/TLS and reconnects, creating the per-experiment streams and the KV
bucket for run state, publishing experience groups and events with de-duplication ids and
readable headers, durable pull consumption with ack-after-durable semantics and a dead-letter
subject, and request/reply. It knows message *shapes* (via ``schemas``) but nothing about
algorithms, models or storage.
"""
