"""Redis commands packed by hiredis (C) instead of redis-py's Python packer.

redis-py's asyncio connections build every command's wire form in Python
(``Connection.pack_command``): about 16 us for a script call carrying an order (measured with
the hot path's EVALSHA of a reply and its request, redis-py 8.1), against 2 us through
``hiredis.pack_command``, which redis-py's own synchronous connections already use when
hiredis is installed (``redis.connection.HiredisRespSerializer``). An order makes three to
four such calls in each of the API and the worker host.

``hiredis_packing(cls)`` is ``cls`` packing as that serializer does, without its Python pass
over every argument (a third of a batched call's client time): same bytes on the wire for
every argument redis-py accepts (str as UTF-8, bytes, int, float, memoryview, bytearray; a
first argument with spaces, such as ``"SCRIPT LOAD"``, split into words), ``DataError`` for
an argument of another type, as before. It applies to a client whose encoding is UTF-8 with
strict errors (redis-py's default, and every client here); without hiredis the class is
returned as is.
"""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio.connection import AbstractConnection
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis

_SERIALIZER = HiredisRespSerializer()
_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


class _HiredisPacking:
    """Mixin: ``pack_command`` by hiredis (``pack_commands`` goes through it)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # What redis.connection.HiredisRespSerializer.pack does, without its pass over every
        # argument: hiredis packs str, bytes, int, float and memoryview itself, so only a
        # call it refuses (a bytearray, or a value redis-py refuses too) goes through that
        # serializer, which converts the first and raises DataError for the others.
        first = args[0]
        if isinstance(first, str):
            words = (*first.encode().split(), *args[1:])
        elif b" " in first:
            words = (*first.split(), *args[1:])
        else:
            words = args
        try:
            return [hiredis.pack_command(words)]
        except TypeError:
            return cast(list[bytes], _SERIALIZER.pack(*args))


def hiredis_packing(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` packing its commands with hiredis (module doc); one class per
    ``connection_class``."""
    if not HIREDIS_AVAILABLE or issubclass(connection_class, _HiredisPacking):
        return connection_class
    packed = _PACKED.get(connection_class)
    if packed is None:
        name = f"Hiredis{connection_class.__name__}"
        packed = _PACKED[connection_class] = type(name, (_HiredisPacking, connection_class), {})
    return packed
