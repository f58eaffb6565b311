#!lua
-- idem release. KEYS[1] = record hash; ARGV = token.
-- Deletes the record when it is in progress with this token: 1; otherwise 0, nothing changed.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'waiters')
if cur[1] ~= '0' or cur[2] ~= ARGV[1] then return 0 end
redis.call('DEL', key)
if cur[3] then redis.call('PUBLISH', key, 'released') end
return 1
