#!lua
-- idem resolve. KEYS[1] = record hash; ARGV = applied ('1' or '0'), value, ttl_ms.
-- Only a parked record (status 3) is resolved: applied, it becomes completed with the value
-- (its token kept, expiring natively at now + ttl); not applied, it is released (status 2,
-- kept 1 s for its token). Returns {1, record as it was} when it was parked and is resolved,
-- {0, record} for any other live record (nothing changed), {0} when the key has no live
-- record. The record is as `get` returns it.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'status', 'token', 'fingerprint', 'value', 'name',
  'created_at', 'expires_at', 'attempt', 'keep_until')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not ((r[1] == '0' or r[1] == '1' or r[1] == '3') and now < tonumber(r[7])) then
  return {0}
end
local found = {r[1], r[2], r[3], r[4], r[5], r[6], r[7], string.format('%.0f', now), r[8], r[9]}
if r[1] ~= '3' then return {0, found} end
if ARGV[1] == '1' then
  local exp = string.format('%.0f', now + tonumber(ARGV[3]))
  redis.call('HSET', key, 'status', '1', 'value', ARGV[2], 'expires_at', exp, 'keep_until', exp)
  redis.call('PEXPIREAT', key, exp)
else
  local ended = string.format('%.0f', now)
  redis.call('HSET', key, 'status', '2', 'expires_at', ended, 'keep_until', ended)
  redis.call('HDEL', key, 'value')
  redis.call('PEXPIRE', key, 1000)
end
return {1, found}
