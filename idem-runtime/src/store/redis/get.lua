#!lua flags=no-writes
-- idem get. KEYS[1] = record hash.
-- Returns {status, token, fingerprint, value, name, created_at, expires_at, now, attempt,
-- keep_until} for a live record (in progress, completed or parked), nil otherwise. Read-only,
-- so it also runs on replicas and under maxmemory.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'status', 'token', 'fingerprint', 'value', 'name',
  'created_at', 'expires_at', 'attempt', 'keep_until')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if (r[1] == '0' or r[1] == '1' or r[1] == '3') and now < tonumber(r[7]) then
  return {r[1], r[2], r[3], r[4], r[5], r[6], r[7], string.format('%.0f', now), r[8], r[9]}
end
return false
