#!lua
-- idem keep_args. KEYS[1] = record hash; ARGV = token, arguments.
-- When this token holds the record (in progress with it, live; protocol::holds): keeps a
-- resumable call's arguments as its value and returns 1; otherwise 0, nothing changed.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'token', 'expires_at')
if cur[1] ~= '0' or cur[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not (now < tonumber(cur[3])) then return 0 end
redis.call('HSET', key, 'value', ARGV[2])
return 1
