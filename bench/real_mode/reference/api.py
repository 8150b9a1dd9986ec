"""The reference design's API process: ``POST /webhook/{token}/order``, lean and batched.

A measuring instrument for issue 13, not product code. Each step does the work of one of
tradecore's steps (``src/tradecore/services/orders/webhook_intake.py``), named in brackets:

1. token -> account from memory, every account loaded at start [layer 1: the token's hash
   looked up by ``webhook_owner``], 404 when unknown;
2. the allowed-IP list, all allowed when empty [step 3, 403];
3. parse and validate with orjson: fields, types, ranges, canonical forms [step 1,
   ``parse_webhook_body``, 400];
4. timestamp freshness, then the secret's SHA-256 compared in constant time [layers 2, 3:
   401]; the plan/credentials/symbol/quantity checks from memory [``OrderChecks``];
5. ONE Lua call: replay fingerprint SET NX EX, the user's rate window, the daily count [layer
   4 + ``WebhookAdmission``: 409 / 429];
6. the group commit (``GroupCommit``, at most 128, no delay when idle): the batch's intents
   (unique (user, fingerprint): a duplicate refuses only its order, 409), their audit entries
   sealed onto the chain, and the chain head's compare-and-set in ONE statement and ONE commit
   [``OrderHistory.add`` and ``PostgresAuditLog.append``: two group commits in tradecore];
7. the batch's requests pushed onto the worker hosts' shared list by ONE RPUSH
   [``OrderQueue.push``: per user, one script each]; a failed push answers 202, the durable
   intent is never withdrawn (the worker's sweep re-pushes it);
8. the reply through ONE pub/sub listener of the process (a future per request id), the
   reply key read once at the deadline [``ReplyInbox``]: 200 with the OrderResult (the
   worker's JSON, passed through), or 202 after ``WAIT_S``.

Every request leaves one sealed audit entry, refusals included, as in tradecore. The seal is
tradecore's (``tradecore/audit_chain.py``): SHA-256 of the previous seal and the entry's
canonical JSON (sorted keys), one global chain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import re
import signal
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import psycopg
import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from tradecore_entrypoints.loop import run_fast, settle_heap  # serve's loop and heap tuning

log = logging.getLogger("reference.api")

WAIT_S = 2.5  # tradecore's WEBHOOK_RESPONSE_WAIT_S default
MAX_BATCH = 128
QUEUE = "ref:requests"  # the worker hosts' shared request list
REPLY_CHANNEL = "ref:replies:"  # + api id
REPLY_KEY = "ref:reply:"  # + request id: the durable reply, REPLY_TTL_S
REPLY_TTL_S = 60
GENESIS = "0" * 64
INSTRUMENTS = frozenset({"BTCUSDT", "ETHUSDT", "ES", "MES", "EURUSD", "AAPL"})  # paper's
SYMBOL = re.compile(r"[A-Z0-9][A-Z0-9._\-/:!]{0,39}")
QUOTED = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?")
ACTIONS = frozenset({"buy", "sell", "close_long", "close_short"})
JSON = "application/json"


def plain(value: Decimal) -> str:
    """A Decimal without exponent or trailing zeros (tradecore's ``canonical_quantity``)."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


class GroupCommit:
    """Callers ``submit`` an item and await its result; the items waiting while a batch is
    written go together in the next (at most ``max_batch``); an item submitted while idle
    starts a batch at once. ``write`` returns one result per item, after its commit."""

    def __init__(self, write: Callable[[list[Any]], Awaitable[list[Any]]], max_batch: int):
        self._write, self._max = write, max_batch
        self._waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None

    def submit(self, item: Any) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self._max]
                del self._waiting[: self._max]
                try:
                    results = await self._write([item for item, _ in batch])
                except Exception as e:  # every caller of the batch gets the failure
                    log.warning("batch of %d failed: %r", len(batch), e)
                    results = [e] * len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._drainer = None


def seal(previous: str, entry: dict[str, Any]) -> str:
    """tradecore's seal: SHA-256 of the previous seal and the entry's canonical JSON."""
    canonical = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(previous.encode() + canonical).hexdigest()


INTENT_COLUMNS = (
    "id text, request_id text, user_id text, account_id text, symbol text, action text, "
    "order_type text, quantity numeric, fingerprint text, reply_to text, created_at timestamptz"
)
AUDIT_COLUMNS = (
    "user_id text, action text, success boolean, ip_address inet, user_agent text, "
    "request_path text, request_method text, error_message text, resource_type text, "
    "resource_id text, metadata jsonb, created_at timestamptz, previous_seal text, seal text"
)


def _names(columns: str) -> str:
    return ", ".join(c.split()[0] for c in columns.split(", "))


# Step 6 in one statement: the head moves from the seal the batch was sealed onto to its last
# seal, and only if that compare-and-set took are the intents and the entries inserted (in
# chain order). A duplicate fingerprint fails the statement (nothing written): the batch is
# then written again without it (``Intake._refuse_duplicates``).
INTAKE_SQL = f"""
WITH head AS (UPDATE chain_head SET seal = %(last)s WHERE seal = %(previous)s RETURNING 1),
intents AS (
  INSERT INTO intents ({_names(INTENT_COLUMNS)}, status)
  SELECT i.*, 'queued' FROM head, jsonb_to_recordset(%(intents)s::jsonb) AS i({INTENT_COLUMNS})
  RETURNING 1),
entries AS (
  INSERT INTO audit_log ({_names(AUDIT_COLUMNS)})
  SELECT {", ".join("e." + n for n in _names(AUDIT_COLUMNS).split(", "))}
  FROM head, ROWS FROM (jsonb_to_recordset(%(entries)s::jsonb) AS ({AUDIT_COLUMNS}))
  WITH ORDINALITY AS e({_names(AUDIT_COLUMNS)}, n) ORDER BY e.n
  RETURNING 1)
SELECT count(*) FROM head
"""


class Intake:
    """Step 6 and 7: the group commit of intents + audit entries + chain head, then the push.
    An item is ``{"intent": dict | None, "entry": dict, "push": bytes | None}``; its result is
    "pushed", "queued" (durable, push failed), "duplicate" or "audited" (a refusal's entry)."""

    def __init__(self, database_url: str, redis: aioredis.Redis) -> None:
        self._url, self._redis = database_url, redis
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._head: str | None = None  # the newest seal this process wrote (a cache)
        self.commit = GroupCommit(self._write, MAX_BATCH)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.broken:
            self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
            self._head = None
        return self._conn

    async def _write(self, items: list[dict[str, Any]]) -> list[str]:
        conn = await self._connection()
        while True:
            if self._head is None:
                cursor = await conn.execute("SELECT seal FROM chain_head")
                self._head = (await cursor.fetchone())[0]
            previous = self._head
            for item in items:  # seal the batch onto the head, in chain order
                entry = item["entry"]
                entry.pop("previous_seal", None)  # a retry seals again
                entry.pop("seal", None)
                sealed = seal(previous, entry)
                entry["previous_seal"], entry["seal"] = previous, sealed
                previous = sealed
            entries = [item["entry"] for item in items]
            intents = [item["intent"] for item in items if item["intent"] is not None]
            try:
                cursor = await conn.execute(
                    INTAKE_SQL,
                    {
                        "previous": self._head,
                        "last": previous,
                        "intents": orjson.dumps(intents).decode(),
                        "entries": orjson.dumps(entries).decode(),
                    },
                )
            except psycopg.errors.UniqueViolation:
                await self._refuse_duplicates(conn, items)
                continue
            if (await cursor.fetchone())[0]:
                self._head = previous
                break
            self._head = None  # another writer moved the head: read it and seal again
        pushes = [item["push"] for item in items if item["intent"] is not None]
        pushed = "pushed"
        if pushes:
            try:
                await self._redis.rpush(QUEUE, *pushes)
            except RedisError as e:
                log.warning("push failed (%r): %d orders wait for the sweep", e, len(pushes))
                pushed = "queued"
        return [
            "duplicate" if item.get("duplicate") else "audited" if not item["intent"] else pushed
            for item in items
        ]

    async def _refuse_duplicates(self, conn: Any, items: list[dict[str, Any]]) -> None:
        """The order history holds a fingerprint of this batch (or the batch holds one
        twice): those items become replay refusals, audited as such [the ``Duplicate`` path]."""
        keyed = [(i["intent"]["user_id"], i["intent"]["fingerprint"]) for i in items if i["intent"]]
        cursor = await conn.execute(
            "SELECT user_id, fingerprint FROM intents WHERE (user_id, fingerprint) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([u for u, _ in keyed], [f for _, f in keyed]),
        )
        taken = {tuple(row) for row in await cursor.fetchall()}
        for item in items:
            intent = item["intent"]
            if intent is None:
                continue
            key = (intent["user_id"], intent["fingerprint"])
            if key in taken:
                item.update(intent=None, push=None, duplicate=True)
                account_id, error = intent["account_id"], "duplicate request (order history)"
                metadata = {"trading_account_id": account_id, "payload_hash": key[1]}
                item["entry"].update(action="webhook_replay_attack", success=False)
                item["entry"].update(error_message=error, resource_type="trading_account")
                item["entry"].update(resource_id=account_id, metadata=metadata)
            taken.add(key)


class Replies:
    """Step 8: one pub/sub connection for the whole process; ``"{request_id} {json}"``."""

    def __init__(self, redis: aioredis.Redis, channel: str) -> None:
        self._redis, self.channel = redis, channel
        self.waiting: dict[bytes, asyncio.Future[bytes]] = {}

    async def start(self) -> None:
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(self.channel)
        self._task = asyncio.create_task(self._listen())

    async def _listen(self) -> None:
        while True:
            try:
                async for message in self._pubsub.listen():
                    request_id, _, reply = message["data"].partition(b" ")
                    future = self.waiting.pop(request_id, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
            except (RedisError, OSError) as e:  # redis-py resubscribes on the next read
                log.warning("reply listener: %r", e)
                await asyncio.sleep(0.1)

    async def wait(self, request_id: str, future: asyncio.Future[bytes], until: float) -> Any:
        """The reply, from its notification or else from its key at the deadline; None."""
        try:
            async with asyncio.timeout_at(until):
                return await future
        except TimeoutError:
            self.waiting.pop(request_id.encode(), None)
        with contextlib.suppress(RedisError):
            return await self._redis.get(REPLY_KEY + request_id)
        return None


# Step 5. KEYS: replay, rate window, daily counter. ARGV: replay TTL (s), limit, window (us),
# window key TTL (ms), a unique member, daily cap (-1: none), the counter's expiry (unix s).
# {0} replay; {1, retry_us} rate limited (nothing stored); {2} cap reached; {3} admitted.
ADMIT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cutoff = now - tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', cutoff))
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {1, string.format('%.0f', tonumber(oldest[2]) - cutoff)}
end
local stamp = string.format('%.0f', now)
redis.call('ZADD', KEYS[2], stamp, stamp .. '-' .. ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1])
local n = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[6]) >= 0 and n >= tonumber(ARGV[6]) then return {2} end
redis.call('INCR', KEYS[3])
if n == 0 then redis.call('EXPIREAT', KEYS[3], ARGV[7]) end
return {3}
"""


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


def _quantity(value: object) -> Decimal | None:
    if (isinstance(value, str) and QUOTED.fullmatch(value)) or type(value) is int:
        quantity = Decimal(value)
    elif isinstance(value, float):
        quantity = Decimal(repr(value))  # the shortest repr: the body's own digits
    else:
        return None
    exponent = quantity.normalize().as_tuple().exponent
    if not (0 < quantity <= Decimal("1e9")) or -int(exponent) > 10:
        return None
    return Decimal(plain(quantity))


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str) or not value.isascii() or not 10 < len(value) <= 64:
        return None
    with contextlib.suppress(ValueError):
        stamp = datetime.fromisoformat(value)
        return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)
    return None


def parse(body: bytes) -> dict[str, Any] | str:
    """Step 3: the payload in canonical form, or why it is refused."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "body is not JSON"
    if not isinstance(document, dict):
        return "body must be a JSON object"
    missing = [
        f for f in ("action", "symbol", "quantity", "timestamp", "secret") if f not in document
    ]
    if missing:
        return "required field missing: " + ", ".join(missing)
    payload = {
        "action": _text(document["action"]).lower(),
        "order_type": _text(document.get("order_type", "entry")).lower(),
        "symbol": _text(document["symbol"]).upper(),
        "quantity": _quantity(document["quantity"]),
        "timestamp": _timestamp(document["timestamp"]),
        "secret": document["secret"],
    }
    if payload["action"] not in ACTIONS:
        return "action must be one of buy, sell, close_long, close_short"
    if payload["order_type"] not in ("entry", "exit"):
        return "order_type must be entry or exit"
    if not SYMBOL.fullmatch(payload["symbol"]):
        return "symbol must be 1 to 40 characters of A-Z, 0-9 and . _ - / : !"
    if payload["quantity"] is None:
        return "quantity must be a positive number not above 1e9, at most 10 decimals"
    if payload["timestamp"] is None:
        return "timestamp must be an ISO 8601 date and time"
    if not isinstance(payload["secret"], str) or not 1 <= len(payload["secret"]) <= 256:
        payload["secret"] = ""  # matches no secret: a 401, as in tradecore
    return payload


def problem(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> Any:
    body = {"type": f"/problems/{code}", "status": status, "detail": detail, "code": code}
    kind = "application/problem+json"
    return web.Response(status=status, body=orjson.dumps(body), content_type=kind, headers=headers)


# A refusal's answer (status, code, detail) and the action of its audit entry (tradecore's).
REFUSALS = {
    "unknown": (404, "not_found", "Not found", "webhook_order"),
    "disabled": (403, "forbidden", "Forbidden", "webhook_order"),
    "ip": (403, "ip_not_allowed", "Source IP not allowed", "webhook_ip_blocked"),
    "invalid": (400, "webhook_payload_invalid", "", "webhook_payload_invalid"),
    "expired": (401, "request_expired", "Request expired", "webhook_timestamp_expired"),
    "secret": (401, "unauthorized", "Unauthorized", "webhook_credential_attack"),
    "plan": (403, "plan_simulation_only", "Real orders not allowed", "webhook_order"),
    "order": (400, "order_refused", "Symbol not allowed or quantity too large", "webhook_order"),
    "replay": (409, "replay", "Duplicate request", "webhook_replay_attack"),
    "rate": (429, "rate_limited", "Too many requests", "webhook_order"),
    "cap": (429, "daily_cap_reached", "Daily order limit of your plan reached", "webhook_order"),
    "down": (503, "unavailable", "Service unavailable", "webhook_order"),
}


class Refused(Exception):
    """A refusal of ``kind`` (REFUSALS); ``fields`` go into its audit entry."""

    def __init__(self, kind: str, headers: dict[str, str] | None = None, **fields: Any) -> None:
        super().__init__(kind)
        self.kind, self.headers, self.fields = kind, headers, fields


class Api:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.redis = aioredis.Redis.from_url(args.redis_url)
        self.intake = Intake(args.database_url, self.redis)
        self.replies = Replies(self.redis, REPLY_CHANNEL + args.api_id)
        self.admit = self.redis.register_script(ADMIT_LUA)
        self.accounts: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        """Load every account into memory (token hash -> account); subscribe for replies."""
        async with await psycopg.AsyncConnection.connect(self.args.database_url) as conn:
            cursor = await conn.execute(
                "SELECT id, user_id, token_hash, secret_hash, allowed_ips, max_request_age,"
                " daily_cap, max_quantity, real_orders, credentials_verified, disabled"
                " FROM accounts"
            )
            names = [c.name for c in cursor.description]
            for row in await cursor.fetchall():
                account = dict(zip(names, row, strict=True))
                account["allowed_ips"] = [ipaddress.ip_network(n) for n in account["allowed_ips"]]
                account["secret_hash"] = account["secret_hash"].encode()
                self.accounts[account["token_hash"]] = account
        await self.replies.start()
        log.warning("reference api %s: %d accounts", self.args.api_id, len(self.accounts))

    def entry(self, request: web.Request, now: datetime, account: Any, **fields: Any) -> dict:
        """An audit entry of this request (tradecore's columns); fields: action, success..."""
        entry = {
            "user_id": None if account is None else account["user_id"],
            "ip_address": request.remote or "0.0.0.0",
            "user_agent": request.headers.get("User-Agent", "")[:512],
            "request_path": "/webhook/<token>/order",
            "request_method": request.method,
            "error_message": None,
            "resource_type": "trading_account",
            "resource_id": None if account is None else account["id"],
            "metadata": {},
            "created_at": now.isoformat(),
        }
        entry.update(fields)
        return entry

    async def webhook(self, request: web.Request) -> web.Response:
        now = datetime.now(UTC)
        body = await request.read()
        token_hash = hashlib.sha256(request.match_info["token"].encode()).hexdigest()
        account = self.accounts.get(token_hash)  # step 1
        try:
            return await self.order(request, now, account, body)
        except Refused as refusal:  # its audit entry through the group commit, then 4xx
            status, code, detail, action = REFUSALS[refusal.kind]
            fields = {"action": action, "success": False, "error_message": detail}
            fields.update(refusal.fields)
            entry = self.entry(request, now, account, **fields)
            try:
                await self.intake.commit.submit({"intent": None, "entry": entry, "push": None})
            except Exception:
                return problem(503, "unavailable", "Service unavailable")
            return problem(status, code, detail or fields["error_message"], refusal.headers)

    async def order(self, request: web.Request, now: datetime, account: Any, body: bytes) -> Any:
        if account is None:
            raise Refused("unknown", error_message="unknown webhook token")
        if account["disabled"]:
            raise Refused("disabled")
        if account["allowed_ips"]:  # step 2
            ip = ipaddress.ip_address(request.remote or "0.0.0.0")
            if not any(ip in network for network in account["allowed_ips"]):
                raise Refused("ip")
        payload = parse(body)  # step 3
        if isinstance(payload, str):
            raise Refused("invalid", error_message=payload)
        stamp, max_age = payload["timestamp"], account["max_request_age"]
        if abs(now - stamp) > timedelta(seconds=max_age):  # step 4
            raise Refused("expired")
        presented = hashlib.sha256(payload["secret"].encode()).hexdigest().encode()
        if not payload["secret"] or not hmac.compare_digest(presented, account["secret_hash"]):
            raise Refused("secret")
        symbol, quantity, user_id = payload["symbol"], payload["quantity"], account["user_id"]
        if not account["real_orders"] or not account["credentials_verified"]:
            raise Refused("plan")
        if symbol not in INSTRUMENTS or quantity > account["max_quantity"]:
            raise Refused("order")
        canonical_ts = stamp.replace(tzinfo=None).isoformat() + "Z"
        source = f"{user_id}:{payload['action']}:{symbol}:{plain(quantity)}:{canonical_ts}:"
        fingerprint = hashlib.sha256((source + payload["secret"]).encode()).hexdigest()[:32]
        order_id, request_id = str(uuid.uuid4()), str(uuid.uuid4())
        ahead = max(0, -(-(stamp - now) // timedelta(seconds=1)))  # whole seconds, rounded up
        day = now.date()
        expiry = datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC)
        tag = "{" + user_id + "}"  # every key of one user in one slot, as tradecore's
        held = (f"ref:replay:{tag}:{fingerprint}", f"ref:daily:{tag}:{day.isoformat()}")
        limit, cap = self.args.rate_limit_per_minute, account["daily_cap"]
        arguments = [max(1, max_age + ahead), limit, 60_000_000, 65_000, request_id, cap]
        try:  # step 5: one round trip
            answer = await self.admit(
                keys=[held[0], f"ref:rate:{tag}", held[1]],
                args=[*arguments, int(expiry.timestamp())],
            )
        except RedisError:
            raise Refused("down", error_message="key-value store down") from None
        if int(answer[0]) == 0:
            metadata = {"trading_account_id": account["id"], "payload_hash": fingerprint}
            raise Refused("replay", error_message="duplicate request", metadata=metadata)
        if int(answer[0]) == 1:
            raise Refused("rate", {"Retry-After": str(max(1, -(-int(answer[1]) // 10**6)))})
        if int(answer[0]) == 2:
            raise Refused("cap")
        intent = {k: payload[k] for k in ("symbol", "action", "order_type")}
        intent.update(id=order_id, request_id=request_id, user_id=user_id)
        intent.update(account_id=account["id"], quantity=plain(quantity))
        intent.update(fingerprint=fingerprint, reply_to=self.replies.channel)
        intent.update(created_at=now.isoformat())
        metadata = {"trading_account_id": account["id"], "simulation": False}
        metadata.update(payload_hash=fingerprint)
        fields = {"action": "webhook_order", "success": True, "metadata": metadata}
        fields.update(resource_type="order", resource_id=order_id)
        return await self.dispatch(intent, self.entry(request, now, account, **fields), held)

    async def dispatch(self, intent: dict[str, Any], entry: dict[str, Any], held: Any) -> Any:
        """Steps 6-8: the durable intent and its audit entry, the push, the reply."""
        loop = asyncio.get_running_loop()
        until = loop.time() + WAIT_S
        order_id, request_id = intent["id"], intent["request_id"]
        waiter = request_id.encode()
        future: asyncio.Future[bytes] = loop.create_future()
        self.replies.waiting[waiter] = future  # before the push: no reply can be missed
        push = orjson.dumps({k: v for k, v in intent.items() if k != "fingerprint"})
        try:
            outcome = await self.intake.commit.submit(
                {"intent": intent, "entry": entry, "push": push}
            )
        except Exception:  # not durable: give back the replay key and the daily slot
            self.replies.waiting.pop(waiter, None)
            with contextlib.suppress(RedisError):
                await self.redis.delete(held[0])
                await self.redis.decr(held[1])
            return problem(503, "unavailable", "Service unavailable")
        reply = None
        if outcome == "pushed":
            reply = await self.replies.wait(request_id, future, until)
        self.replies.waiting.pop(waiter, None)
        if outcome == "duplicate":
            return problem(409, "replay", "Duplicate request")
        if reply is not None:
            return web.Response(body=reply, content_type=JSON)
        poll = f"/trading/orders/{order_id}"
        queued = {"order_id": order_id, "request_id": request_id, "status": "queued", "poll": poll}
        body = orjson.dumps(queued)
        headers = {"Location": poll}
        return web.Response(status=202, body=body, content_type=JSON, headers=headers)


async def ready(_: web.Request) -> web.Response:
    return web.Response(text="ready")


async def serve(args: argparse.Namespace) -> None:
    api = Api(args)
    await api.start()
    app = web.Application(client_max_size=16 * 1024)
    app.router.add_post("/webhook/{token}/order", api.webhook)
    app.router.add_get("/health/ready", ready)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=75.0, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    settle_heap()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--api-id", default="api1")
    parser.add_argument("--rate-limit-per-minute", type=int, default=60)  # tradecore's default
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run_fast(serve(args))


if __name__ == "__main__":
    main()
