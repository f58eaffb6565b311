#!lua
-- idem mark_waiting. KEYS[1] = record hash.
-- A waiter, already subscribed to the key's channel, asks the record's completion (or release)
-- to publish: returns 1 when the record is in progress, with `waiters` set (by this call or an
-- earlier waiter); 0 when it is not in progress (any more), so the waiter reads it at once.
-- Only a marked record publishes: a completion nobody waits for sends nothing.
local key = KEYS[1]
local cur = redis.call('HMGET', key, 'status', 'waiters')
if cur[1] ~= '0' then return 0 end
if not cur[2] then redis.call('HSET', key, 'waiters', '1') end
return 1
