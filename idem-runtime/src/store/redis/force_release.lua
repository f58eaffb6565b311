#!lua
-- idem force_release. KEYS[1] = record hash.
-- Ends the live record whatever its state (a parked one too: that frees it), as release.lua
-- does (status 2, its token kept for 1 s), and returns it as it was, as `get` does. Returns
-- nil, changing nothing, when the key has no live record.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'status', 'token', 'fingerprint', 'value', 'name',
  'created_at', 'expires_at', 'attempt', 'keep_until')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not ((r[1] == '0' or r[1] == '1' or r[1] == '3') and now < tonumber(r[7])) then
  return false
end
local ended = string.format('%.0f', now)
redis.call('HSET', key, 'status', '2', 'expires_at', ended, 'keep_until', ended)
redis.call('HDEL', key, 'value', 'waiters')
redis.call('PEXPIRE', key, 1000)
redis.call('PUBLISH', key, 'released')
-- Announced to every instance's cache (`Store::releases`) on `<prefix>:v1:released`, the key's
-- hex as the message. One server only: the cluster's script has no lines marked `announce`.
local brace = string.find(key, '{', 1, true) -- announce
redis.call("PUBLISH", string.sub(key, 1, brace - 1) .. 'released', string.sub(key, brace + 1, -2)) -- announce
return {r[1], r[2], r[3], r[4], r[5], r[6], r[7], ended, r[8], r[9]}
