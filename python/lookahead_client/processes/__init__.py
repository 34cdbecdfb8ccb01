"""Processes the tests and benchmarks start: a real ``lookahead-server``
(:mod:`.server`), a real ``nats-server`` (:mod:`.nats`), and a Python child that reports back
(:mod:`.child`). Not part of the drafting library."""
