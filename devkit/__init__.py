"""Real parts of a gateway run locally for tests, benchmarks and ``make run``.

Nothing in the services imports this package.
"""
