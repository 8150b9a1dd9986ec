"""Ports: every effect the core needs, as Protocols whose docstrings state the contract.

Adapters in ``tradecore_adapters`` implement them (memory for the embedded default and tests;
Redis, Postgres, aiohttp and others for production). One module per kind of effect; import
each name from the module that defines it (this package re-exports nothing):

``broker``        a connection to a trading account at a broker, the orders it reports, the
                  factory that opens it, the account it is opened for and the directory of
                  tradable symbols;
``crypto``        broker credentials: encrypted at rest, sealed in transit, checked;
``documents``     named JSON documents read and written as one piece;
``identity``      password hashing, signed tokens, the bot challenge and outgoing mail;
``messaging``     the queues between the API and the per-user workers;
``prices``        the prices paper orders fill at;
``protection``    short-lived protective state: replay keys, rate limits, the alert throttle;
``repositories``  durable records: users, sessions, keys, allowed IPs, accounts, orders, audit;
``resets``        single-use password-reset tokens;
``runtime``       time, sleeping and randomness.
"""
