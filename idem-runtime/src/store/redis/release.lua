#!lua
-- idem release. KEYS[1] = record hash; ARGV = token.
-- Ends the record when this token holds it (in progress with it, live; protocol::holds): 1;
-- otherwise 0, nothing changed. Ended, not deleted: the hash keeps its token (status 2,
-- released, no value) for 1 s (protocol::KEEP_ENDED), so a claim in the same millisecond passes
-- it rather than handing it out again, and does not take it for abandoned.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'waiters', 'expires_at')
if cur[1] ~= '0' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not (now < tonumber(cur[4])) then return 0 end
local ended = string.format('%.0f', now)
redis.call('HSET', key, 'status', '2', 'expires_at', ended, 'keep_until', ended)
redis.call('HDEL', key, 'value', 'waiters')
redis.call('PEXPIRE', key, 1000)
if cur[3] then redis.call('PUBLISH', key, 'released') end
return 1
