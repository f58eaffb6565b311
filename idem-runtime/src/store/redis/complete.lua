#!lua
-- idem complete. KEYS[1] = record hash, KEYS[2] = its tombstone hash; ARGV = token, value,
-- ttl_ms, tombstone_ms (0: none).
-- Returns 1 when this token held the record (in progress with it, live; protocol::holds) and
-- it is now completed (kept until now + ttl), 2 when it is already completed with this token
-- (this call retried after a lost reply), 0 otherwise (taken over, released, lapsed, parked):
-- nothing changed.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'waiters', 'expires_at', 'fingerprint',
  'name', 'created_at')
if cur[2] ~= ARGV[1] then return 0 end
if cur[1] == '1' then return 2 end
if cur[1] ~= '0' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not (now < tonumber(cur[4])) then return 0 end
local exp = string.format('%.0f', now + tonumber(ARGV[3]))
redis.call('HSET', key, 'status', '1', 'value', ARGV[2], 'expires_at', exp, 'keep_until', exp)
-- A completed record expires natively at its end: the claim's one-read replay relies on it.
redis.call('PEXPIREAT', key, exp)
-- With a tombstone: a small hash of its own, the record without its value, kept past the TTL
-- (its own native expiry), that the claim reads once the record is gone.
local tomb = tonumber(ARGV[4])
if tomb and tomb > 0 then
  local keep = string.format('%.0f', now + tonumber(ARGV[3]) + tomb)
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'status', '1', 'token', ARGV[1], 'fingerprint', cur[5],
    'name', cur[6], 'created_at', cur[7], 'expires_at', exp, 'keep_until', keep)
  redis.call('PEXPIREAT', KEYS[2], keep)
end
-- Only when a waiter marked the record (mark.lua): PUBLISH is a call of its own.
if cur[3] then redis.call('PUBLISH', key, 'completed') end
return 1
