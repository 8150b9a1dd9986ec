-- wrk script: webhook orders with a unique body per request (the closed loop of
-- bench/webhook_load.py wrk and bench/real_mode/run.py --client wrk, with a C client; both run
-- it through bench/wrk_runner.py).
--
--   wrk -t2 -c16 -d20s -s bench/webhook.lua http://127.0.0.1:8099
--
-- Reads the accounts from ACCOUNTS_LUA (default bench/results/accounts.lua; wrk_runner.py
-- writes it in a temporary directory): a Lua file returning
-- { {path = "/webhook/<token>/order", secret = "..."}, ... }. WRK_THREADS must equal -t.
--
-- Thread i of n takes accounts i, i+n, i+2n, ... in turn, so an account comes back only
-- after (accounts / threads) requests of its thread, far more than the thread's connections:
-- its previous request has been answered. Each account alternates a buy entry and a sell exit
-- of the same quantity on BTCUSDT; the quantity carries a per-account sequence number, so no
-- two bodies are alike within a run (the timestamp has whole seconds only).
-- Anything but 200 with "status":"filled" counts as an error, printed at the end.

local threads = {}

function setup(thread)
   -- setup and init run once per thread, in order, before any thread starts.
   thread:set("index", #threads)
   table.insert(threads, thread)
end

local mine = {}
local turn = 0
local dry_run = false
filled, refused, bad_status = 0, 0, 0

function init(args)
   local path = os.getenv("ACCOUNTS_LUA") or "bench/results/accounts.lua"
   local all = dofile(path)
   local step = tonumber(os.getenv("WRK_THREADS") or "1")
   for i = index + 1, #all, step do
      table.insert(mine, {path = all[i].path, secret = all[i].secret, seq = 0, open = nil})
   end
   -- wrk calls request() once on thread 0 to check it, and never sends that request.
   dry_run = index == 0
end

function request()
   local account = mine[turn % #mine + 1]
   local action, order_type, quantity
   if dry_run then
      dry_run = false
      quantity, action, order_type = "0.1", "buy", "entry"
   elseif account.open == nil then
      turn = turn + 1
      account.seq = account.seq + 1
      quantity = string.format("0.1%06d", account.seq)
      action, order_type = "buy", "entry"
      account.open = quantity
   else
      turn = turn + 1
      quantity = account.open
      action, order_type = "sell", "exit"
      account.open = nil
   end
   local body = string.format(
      '{"action": "%s", "order_type": "%s", "symbol": "BTCUSDT", "quantity": %s, ' ..
      '"timestamp": "%s", "secret": "%s"}',
      action, order_type, quantity, os.date("!%Y-%m-%dT%H:%M:%SZ"), account.secret)
   return wrk.format("POST", account.path, {["Content-Type"] = "application/json"}, body)
end

function response(status, headers, body)
   if status ~= 200 then
      refused = refused + 1
   elseif string.find(body, '"status":"filled"', 1, true) then
      filled = filled + 1
   else
      bad_status = bad_status + 1
   end
end

function done(summary, latency, requests)
   local ok, non200, notfilled = 0, 0, 0
   for _, t in ipairs(threads) do
      ok = ok + t:get("filled")
      non200 = non200 + t:get("refused")
      notfilled = notfilled + t:get("bad_status")
   end
   local seconds = summary.duration / 1e6
   io.write(string.format(
      'WRK_RESULT {"requests": %d, "filled": %d, "non_200": %d, "not_filled": %d, ' ..
      '"socket_errors": %d, "rate_per_s": %.1f, "latency_ms": {"p50": %.3f, ' ..
      '"p90": %.3f, "p99": %.3f, "max": %.3f}}\n',
      summary.requests, ok, non200, notfilled,
      summary.errors.connect + summary.errors.read + summary.errors.write +
      summary.errors.timeout,
      summary.requests / seconds, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
      latency:percentile(99) / 1000, latency.max / 1000))
end
