#!lua
-- idem renew. KEYS[1] = record hash; ARGV = token, lease_ms.
-- Moves the end of the lease to now + lease when this token holds the record (in progress with
-- it, live; protocol::holds): 1; otherwise 0, nothing changed. `keep_until` never falls below
-- the lease's end.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'expires_at', 'keep_until')
if cur[1] ~= '0' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not (now < tonumber(cur[3])) then return 0 end
local exp = now + tonumber(ARGV[2])
local keep = math.max(tonumber(cur[4]) or exp, exp)
redis.call('HSET', key, 'expires_at', string.format('%.0f', exp), 'keep_until',
  string.format('%.0f', keep))
redis.call('PEXPIREAT', key, string.format('%.0f', keep + 1000))
return 1
