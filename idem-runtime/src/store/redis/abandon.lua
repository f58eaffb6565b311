#!lua
-- idem abandon. KEYS[1] = record hash; ARGV = token.
-- When this token holds the record (in progress with it, live; protocol::holds): ends its
-- lease now, leaving it in progress and kept until `keep_until` (its native expiry is left as
-- the claim set it), so the next claim takes it over as abandoned; returns 1. Otherwise 0,
-- nothing changed.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'waiters', 'expires_at', 'keep_until')
if cur[1] ~= '0' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not (now < tonumber(cur[4])) then return 0 end
redis.call('HSET', key, 'expires_at', string.format('%.0f', now))
if not cur[5] then
  -- Written before keep_until existed: kept until now, then as good as free.
  redis.call('HSET', key, 'keep_until', string.format('%.0f', now))
  redis.call('PEXPIRE', key, 1000)
end
redis.call('HDEL', key, 'waiters')
if cur[3] then redis.call('PUBLISH', key, 'abandoned') end
return 1
