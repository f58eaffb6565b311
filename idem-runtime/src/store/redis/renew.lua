#!lua
-- idem renew. KEYS[1] = record hash; ARGV = token, lease_ms.
-- Moves the end of the lease to now + lease when this token holds the record (in progress with
-- it, live; protocol::holds): 1; otherwise 0, nothing changed.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'expires_at')
if cur[1] ~= '0' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not (now < tonumber(cur[3])) then return 0 end
local exp = string.format('%.0f', now + tonumber(ARGV[2]))
redis.call('HSET', key, 'expires_at', exp)
redis.call('PEXPIREAT', key, exp)
return 1
