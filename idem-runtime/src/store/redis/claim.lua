#!lua
-- idem claim. KEYS[1] = record hash; ARGV = name, fingerprint, lease_ms, nonce.
-- Returns {1, token} when this attempt now holds the key (a new claim, the takeover of a
-- record that is no longer live, or this very attempt's claim retried after a lost reply),
-- or {0, status, token, fingerprint, value, name, created_at, expires_at, now} for the live
-- record of another attempt (`now` nil for a completed record, see below). Times are ms on
-- the server clock; tokens are decimal strings.
local key = KEYS[1]
-- Every field in one read.
local cur = redis.call('HMGET', key, 'status', 'token', 'expires_at', 'nonce', 'fingerprint',
  'value', 'name', 'created_at')
local status, token = cur[1], cur[2]
-- A completed record that is still there is live: its key expires natively at `expires_at`
-- (PEXPIREAT, on the clock TIME reads), and an expired key reads as absent. So a replay is this
-- one HMGET: no TIME, whose call costs as much as the read. `now` is then nil (the caller does
-- not decide on it for a completed record).
if status == '1' then
  return {0, status, token, cur[5], cur[6], cur[7], cur[8], cur[3], false}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if (status == '0' or status == '1') and now < tonumber(cur[3]) then
  if status == '0' and cur[4] == ARGV[4] then
    return {1, token}
  end
  return {0, status, token, cur[5], cur[6], cur[7], cur[8], cur[3], string.format('%.0f', now)}
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
-- A record that is no longer live goes first, so none of its fields survive (HSET below
-- writes every field but `value`). A new key skips the DEL.
if status or cur[6] then redis.call('DEL', key) end
redis.call('HSET', key, 'status', '0', 'token', ntok, 'fingerprint', ARGV[2], 'name', ARGV[1],
  'created_at', string.format('%.0f', now), 'expires_at', exp, 'nonce', ARGV[4])
redis.call('PEXPIREAT', key, exp)
return {1, ntok}
