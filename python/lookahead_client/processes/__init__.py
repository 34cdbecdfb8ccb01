"""A testing API: the processes the tests and benchmarks start, for a user's own integration
tests too: a real ``lookahead-server`` (:mod:`.server`, ``ServerProcess``: on a free port or a
Unix socket, killed and waited for on exit), a real ``nats-server`` (:mod:`.nats`) and a
Python child that reports back (:mod:`.child`). Not part of the drafting library: production
code never imports it (``tests/test_layering.py``)."""
