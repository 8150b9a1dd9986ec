"""In-memory adapters: the embedded default runtime and the fakes of the core's unit tests.

They keep the same semantics as the production adapters (atomic claims, reliable queues,
compare-and-set transitions), so a test that passes on them states the port's contract.
"""
