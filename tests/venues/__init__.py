"""Local venue emulators: aiohttp servers on 127.0.0.1 that speak a venue's documented REST wire
format (paths, request signing, JSON shapes, error codes), so the real broker libraries (ccxt,
alpaca-py) can be tested without a network. They follow the venues' public API documentation,
not our adapters' assumptions."""
