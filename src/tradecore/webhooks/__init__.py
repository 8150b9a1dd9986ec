"""The pure webhook rules, one module per job; import each name from the module that defines it.

``canonical``
    The canonical forms of the fields (symbol, quantity, timestamp) that parsing, comparison
    and the replay fingerprint share.
``payload``
    Strict parsing of an untrusted body into a ``WebhookPayload`` or a ``PayloadInvalid``, and
    the rule of every known field.
``checks``
    The checks a parsed request passes: the timestamp window (layer 2), the secret (layer 3),
    the replay fingerprint and its lifetime (layer 4), and the account's symbol list.

Everything is a pure function of its arguments: the caller passes ``now`` (from its Clock).
"""
