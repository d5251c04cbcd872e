"""The Lua scripts every write to the shared store runs (EVALSHA): each is atomic and one round
trip, so nothing is read and then written from Python (proxy/state/shared.py says what each key
holds).

- `RECORD`: write an exhaustion (unless `ARGV[7]` asks to keep an existing entry) and publish it.
- `APPROVE`: spend an entry's approval once: compare the budget id, spend, publish, in one step,
  so two replicas racing on one budget id approve exactly one call.
- `CLEAR`: forget an operation and publish that.
- `BUDGET`: add this replica's calls and retries to the window's buckets and read the totals.
- `RESEND_CLAIM`, `RESEND_ANSWER`, `RESEND_GONE`: a re-send record (proxy/state/resends.py): list a
  running call unless a replica listed it, store its answer unless another replica holds the
  record, delete it (only if ours, when asked); each publishes what it did.
"""

RECORD = """
if ARGV[7] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'b', ARGV[1], 'r', ARGV[2], 't', ARGV[3], 's', ARGV[4], 'a', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PUBLISH', ARGV[8], ARGV[9])
return 1
"""
# 1: approved now (or spent earlier by an attempt with this nonce, ARGV[4], whose answer never
# reached us); 0: another budget, or already spent; -1: the store holds no such entry
APPROVE = """
local fields = redis.call('HMGET', KEYS[1], 'b', 'a', 'n')
if not fields[1] then return -1 end
if fields[1] ~= ARGV[1] then return 0 end
if fields[2] == '1' then
  if fields[3] == ARGV[4] then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'a', '1', 'n', ARGV[4])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""
CLEAR = """
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
"""
# KEYS: the window's buckets, oldest first; ARGV: calls and retries to add to each, then the TTL.
BUDGET = """
local ttl = tonumber(ARGV[#ARGV])
local calls, retries = 0, 0
for i, key in ipairs(KEYS) do
  local dc, dr = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  if dc > 0 then redis.call('HINCRBY', key, 'c', dc) end
  if dr > 0 then redis.call('HINCRBY', key, 'r', dr) end
  if dc > 0 or dr > 0 then redis.call('EXPIRE', key, ttl) end
  local got = redis.call('HMGET', key, 'c', 'r')
  calls = calls + (tonumber(got[1]) or 0)
  retries = retries + (tonumber(got[2]) or 0)
end
return {calls, retries}
"""
# KEYS[1]: the record; ARGV: replica, TTL ms, keyed, arguments digest, channel, message.
# 1: listed now; else {0, state, keyed, arguments digest, TTL ms} of the record a replica
# listed first (one record per operation)
RESEND_CLAIM = """
local found = redis.call('HMGET', KEYS[1], 's', 'k', 'g')
if found[1] then return {0, found[1], found[2], found[3], redis.call('PTTL', KEYS[1])} end
redis.call('HSET', KEYS[1], 's', 'r', 'o', ARGV[1], 'k', ARGV[3], 'g', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"""
# ARGV: replica, answer, TTL ms, keyed, arguments digest, channel, message.
# 1: stored (ours, or no record: a listing the store missed); 0: another replica's record
RESEND_ANSWER = """
local owner = redis.call('HGET', KEYS[1], 'o')
if owner and owner ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 's', 'a', 'o', ARGV[1], 'a', ARGV[2], 'k', ARGV[4], 'g', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[6], ARGV[7])
return 1
"""
# ARGV: channel, message, "1" to delete only a record of this replica's, replica.
RESEND_GONE = """
if ARGV[3] == '1' then
  local owner = redis.call('HGET', KEYS[1], 'o')
  if owner and owner ~= ARGV[4] then return 0 end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
"""

ALL = (RECORD, APPROVE, CLEAR, BUDGET, RESEND_CLAIM, RESEND_ANSWER, RESEND_GONE)  # loaded at each reconcile
