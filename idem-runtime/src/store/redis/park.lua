#!lua
-- idem park. KEYS[1] = record hash; ARGV = token.
-- When this token holds the record (in progress with it, live; protocol::holds): parks it
-- (status 3, expires_at = keep_until = i64::MAX, no native expiry: it stays until an operator
-- resolves it) and returns 1; otherwise 0, nothing changed. Waiters are told: they answer
-- "outcome unknown" at once.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'waiters', 'expires_at')
if cur[1] ~= '0' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not (now < tonumber(cur[4])) then return 0 end
redis.call('HSET', key, 'status', '3', 'expires_at', '9223372036854775807', 'keep_until',
  '9223372036854775807')
redis.call('HDEL', key, 'waiters')
redis.call('PERSIST', key)
if cur[3] then redis.call('PUBLISH', key, 'parked') end
return 1
