#!lua
-- idem claim. KEYS[1] = record hash, KEYS[2] = its tombstone hash; ARGV = name, fingerprint, lease_ms, nonce, keep_ms
-- (max(lease, ttl): how long the record is kept, so that an attempt that dies is remembered as
-- abandoned as long as its result would have been).
-- Returns {1, token, attempt, abandoned_at} when this attempt now holds the key (a new claim,
-- the takeover of a record that is no longer live, or this very attempt's claim retried after a
-- lost reply); `abandoned_at` (the abandoned attempt's created_at) is nil unless the claim took
-- over an abandoned attempt (in progress, lapsed, still kept). Otherwise
-- {0, status, token, fingerprint, value, name, created_at, expires_at, now, attempt, keep_until}
-- for the live record of another attempt (`now` nil for a completed or parked record, see
-- below). Times are ms on the server clock; tokens are decimal strings.
local key = KEYS[1]
-- Every field in one read.
local cur = redis.call('HMGET', key, 'status', 'token', 'expires_at', 'nonce', 'fingerprint',
  'value', 'name', 'created_at', 'attempt', 'keep_until', 'abandoned_at')
local status, token = cur[1], cur[2]
-- A completed record that is still there is live: its key expires natively at `expires_at`
-- (PEXPIREAT, on the clock TIME reads), and an expired key reads as absent. A parked one never
-- expires. So a replay is this one HMGET: no TIME, whose call costs as much as the read. `now`
-- is then nil (the caller does not decide on it for these).
if status == '1' or status == '3' then
  return {0, status, token, cur[5], cur[6], cur[7], cur[8], cur[3], false, cur[9], cur[10]}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- No record: a tombstone (complete.lua, `tombstone = …`) may still be kept, and refuses the
-- claim as a live record would (protocol::occupied); it expires natively at its end. It is
-- answered as the completed record it was, without the value.
if not status and KEYS[2] then
  local tomb = redis.call('HMGET', KEYS[2], 'token', 'fingerprint', 'name', 'created_at',
    'expires_at', 'keep_until')
  if tomb[1] then
    return {0, '1', tomb[1], tomb[2], false, tomb[3], tomb[4], tomb[5],
      string.format('%.0f', now), '1', tomb[6]}
  end
end
if status == '0' and now < tonumber(cur[3]) then
  if cur[4] == ARGV[4] then
    return {1, token, cur[9] or '1', cur[11] or false}
  end
  return {0, status, token, cur[5], cur[6], cur[7], cur[8], cur[3], string.format('%.0f', now),
    cur[9], cur[10]}
end
-- protocol::abandoned: in progress, lapsed, still kept. A record without `keep_until` was
-- written before abandoned attempts were told apart: a lapsed one then meant a free key.
local attempt, abandoned_at = 1, false
if status == '0' and cur[10] and now <= tonumber(cur[10]) then
  attempt = (tonumber(cur[9]) or 1) + 1
  abandoned_at = cur[8]
end
-- protocol::next_token: max(previous + 1, now_ms * 1000). Exact in a double below 2^53
-- (microseconds since 1970 stay below it until the year 2255).
local next = now * 1000
if token then
  local p = tonumber(token)
  if p and p + 1 > next then next = p + 1 end
end
local ntok = string.format('%.0f', next)
local exp = string.format('%.0f', now + tonumber(ARGV[3]))
local keep = now + math.max(tonumber(ARGV[5]), tonumber(ARGV[3]))
-- A record that is no longer live goes first, so none of its fields survive (HSET below
-- writes every field but `value`). A new key skips the DEL.
-- A takeover keeps a resumable call's arguments (its value while in progress) for the attempt
-- that takes over, and for a resumer should that attempt die too.
local args = nil
if abandoned_at then args = redis.call('HGET', key, 'value') end
if status or cur[6] then redis.call('DEL', key) end
redis.call('HSET', key, 'status', '0', 'token', ntok, 'fingerprint', ARGV[2], 'name', ARGV[1],
  'created_at', string.format('%.0f', now), 'expires_at', exp, 'nonce', ARGV[4],
  'attempt', tostring(attempt), 'keep_until', string.format('%.0f', keep))
if abandoned_at then redis.call('HSET', key, 'abandoned_at', abandoned_at) end
if args then redis.call('HSET', key, 'value', args) end
-- Kept until keep_until, and protocol::KEEP_ENDED past it.
redis.call('PEXPIREAT', key, string.format('%.0f', keep + 1000))
return {1, ntok, tostring(attempt), abandoned_at}
