--- mirza.pool: several endpoints (daemons, machines) behind one acquire.
---
--- A request goes to the healthy endpoint with the fewest requests in
--- flight, never past that endpoint's own limit. A limit given (`@N`,
--- `limit =`) is fixed; else each endpoint's is found as the requests go
--- (mirza.limit: the load where its token rate is best, at most the
--- ceiling its server announces: `set_ceiling`, mirza.capacity, read by
--- `probe` for a batch and `read_capacity` for an engine over the pool). A
--- request that failed once is retried on another endpoint while one is
--- healthy.
---
--- What a failure says about the endpoint is its class (mirza.retry):
---
---   "endpoint" (refused, cut, timeout, a daemon gone, HTTP 502/503/504)
---       rests it (exponential backoff) and counts toward `down_for` and
---       `unreachable`.
---   "unsupported" (HTTP 404/405/501: no such route), "item" (another
---       4xx, a bad frame) never count against it: it answered.
---   "retry" never rests it for one request: an HTTP 500 or an error
---       frame may be that request's fault (MTPLX answers 500 to a bad
---       field) while the endpoint serves the others; a 429 pauses it (not
---       failing) for its Retry-After, else `rest`, at most `rest_max`.
---
--- 5xx on everything: a server fault (an HTTP 5xx other than 501-504, an
--- error frame) of `suspect_items` different requests in a row, with no
--- success from the endpoint between, rests it like a failure of its own.
--- A request counts once per endpoint, ever (remembered for the last
--- `suspect_keys` of them): the retries of a bad item never count again,
--- so bad items among good ones never rest it, and a run of bad items in
--- a row rests it once per `suspect_items` of them until a good one
--- succeeds; another 4xx neither counts nor breaks the run. A failure
--- while the endpoint already rests does not lengthen the rest (the
--- requests of one wave say one thing). When the rest is over
--- the endpoint is probed with one request at a time until one succeeds
--- (a half-open circuit breaker). A task waiting for a slot is suspended
--- on a `mirza.loop` condition, so the pool holds no thread and no busy
--- loop.
---
--- Prefix affinity: a request given a prefix key (`P.prefix_key` of its
--- leading messages or prompt) goes to the endpoint that took that key
--- last while it is healthy and has room, so a daemon's prompt cache
--- (llama-server's slots, vLLM's prefix caching, MTPLX's sessions) serves
--- the shared prefix again; when that endpoint is full the request goes
--- to the least loaded one as without a key, which then holds the key.
--- The keys are kept in an LRU of `affinity_keys` entries (bounded
--- memory); `affinity = false` ignores them.
---
--- The pool also tells its user when to give up: `unreachable()` (no
--- endpoint ever answered and all refuse) and `down_for()` (how long every
--- endpoint has been failing).
---
--- State lives in the pool object (`pool.new`), none in the module.
local mirza = require "mirza"
local loop = require "mirza.loop"
local retry = require "mirza.retry"
local limit_mod = require "mirza.limit"
local resolve = require("mirza.url").resolve

local P = {}

---@class mirza.Endpoint
---@field url string      the endpoint as given ("http://10.0.0.2:8080", a route's URL, a query string):
---  `require("mirza.url").resolve(e.url, route)` is the URL of a request to it
---@field base string     its base URL, e.g. "http://10.0.0.2:8080/v1" (mirza.url)
---@field limit integer   most requests in flight now (a fixed one, or its limiter's)
---@field fixed boolean   the limit was given (`@N`, `limit =`): it never moves
---@field limiter mirza.Limit|nil what finds the limit when none was given (mirza.limit)
---@field alone boolean the pool's only endpoint: at its limiter's ceiling one more request waits queued there
---@field inflight integer
---@field peak integer     most requests ever in flight at once
---@field fails integer   consecutive failures blamed on it (0: healthy)
---@field rest_until number clock time before which it gets no request (a rest, or a 429's pause)
---@field served integer  requests completed
---@field failed integer  requests that failed because of the endpoint
---@field answered boolean it answered once (a success or any HTTP status)
---@field refused integer connections refused in a row
---@field refused_since number|nil clock time of the first of those refusals
---@field failing_since number|nil clock time of the first of its `fails`
---@field faults integer different requests with a server fault (5xx, error frame) since its last success
---@field bad table<any, true> requests that had a server fault there (counted once, ever)
---@field faulting true|nil it rests or is probed for a run of server faults (not for its own failures)
---@field nbad integer how many
---@field last_error string|nil the message of its last failure
---@field model string|nil the model it serves, once a user asked (mirza.batch)
---@field model_asked mirza.Condition|nil set while a user asks it for its model (mirza.batch)
---@field capacity mirza.Capacity|false|nil what its server announced (`probe`; false: nothing), nil before it was asked
---@field metrics "vllm"|"llama"|nil its /metrics counts the requests its server queues (`probe`)
---@field _probe mirza.Task|nil the probe of `read_capacity`, under way or over

---@class mirza.Pool
---@field endpoints mirza.Endpoint[]
---@field affinity boolean whether prefix keys steer the choice
---@field affine integer requests sent to the endpoint their key went to last
---@field spread integer requests whose key's endpoint had no room (sent to the least loaded)
local Pool = {}
Pool.__index = Pool

-- One request more than the limit while its limiter sits at the slots
-- the server announced: it waits in the server's queue and starts the
-- moment a slot frees, where one sent then would first wait for the
-- client to see the end and send (llama -np 1: the default at 1 was 3-4 %
-- slower than @2). Never more: each connection holds one of the server's
-- HTTP threads (llama-server has its slots + 4). Not in the start: sent
-- with a round, it could take the slot of one of the round's requests,
-- whose wait would read as a queue. Not in a pool of several: there a
-- slot free elsewhere serves the next item at once, and one queued at
-- a server may wait while another frees first (16 + 4 slots: the 4-slot
-- server took 21 of 100 items and finished 0.3 s after the other).
local function queued_one(e)
  local lim = e.limiter
  return e.alone and lim and lim.ceiling and lim.mode ~= "start" and e.limit >= lim.ceiling
    and e.limit < (lim.hard or math.huge) and 1 or 0
end

-- The endpoint's limit right now: 1 while probing after a rest.
local function current_limit(e)
  return e.fails > 0 and 1 or e.limit + queued_one(e)
end

P.defaults = {
  limit = nil,           -- per endpoint, unless given with it; nil: found as the requests go (mirza.limit)
  rest = 0.5,            -- first rest after a failure, seconds
  rest_max = 30,         -- longest rest
  suspect_items = 4,     -- different requests with a 5xx or error frame in a row before the endpoint rests
  suspect_keys = 4096,   -- requests remembered per endpoint as having had a 5xx there (counted once)
  unreachable_after = 1, -- seconds every never-answered endpoint refused before unreachable() says so
  affinity = true,       -- a request with a prefix key goes where that key went last, while it has room
  affinity_keys = 4096,  -- prefix keys remembered (least recently used forgotten first)
  prefix_bytes = 512,    -- a prefix key covers at least this many bytes of the request's start
  idle_evict = 1,        -- seconds an idle prompt copy keeps its slot from a prefix whose own copies are busy:
                         -- one still in use is taken again sooner (its next item is due within an answer's
                         -- time); one idle longer is likely done with (a sorted input moved on), and the busy
                         -- prefix takes its slot instead of waiting for its own copy
}

-- An endpoint as its user wrote it (`url`: its routes made from it by
-- mirza.url's rule) and its base URL (`base`: what messages and records
-- name). Without a limit, a limiter finds it (`auto`: mirza.limit's options).
local function new_endpoint(url, limit, i, auto)
  local _, base = resolve(url)
  local e = { url = url, base = base, limit = limit, fixed = limit ~= nil, inflight = 0, peak = 0, fails = 0,
    rest_until = 0, served = 0, failed = 0, index = i, answered = false, refused = 0, faults = 0, bad = {}, nbad = 0,
    open = {} }
  if not limit then
    e.limiter = limit_mod.new(auto)
    e.limit = e.limiter:get()
  end
  return e
end

---A pool over endpoints given as their users write them (a bare host, a
---base with a path, a route's URL, a query string kept: mirza.url) or
---`{url=, limit=}` tables.
---`clock` replaces `mirza.now` (tests drive the rests with a fake one).
---A limit given (`limit` in an endpoint's table, else `opts.limit`) is
---fixed; without one, each endpoint's is found as the requests go
---(mirza.limit, its options in `opts.auto`).
---@param endpoints (string|{url: string, limit?: integer})[]
---@param opts? {limit?: integer, rest?: number, rest_max?: number, suspect_items?: integer, suspect_keys?: integer,
---  unreachable_after?: number, affinity?: boolean, affinity_keys?: integer, idle_evict?: number, loop?: mirza.Loop,
---  clock?: fun(): number, auto?: table}
---@return mirza.Pool
function P.new(endpoints, opts)
  opts = opts or {}
  if type(endpoints) == "string" then endpoints = { endpoints } end
  if type(endpoints) ~= "table" or #endpoints == 0 then error("mirza.pool: at least one endpoint", 2) end
  local self = setmetatable({ endpoints = {}, cond = loop.condition(opts.loop), clock = opts.clock or mirza.now },
    Pool)
  for _, k in ipairs { "rest", "rest_max", "suspect_items", "suspect_keys", "unreachable_after", "affinity_keys",
    "idle_evict" } do
    self[k] = opts[k] or P.defaults[k]
  end
  if opts.affinity == nil then self.affinity = P.defaults.affinity else self.affinity = opts.affinity and true end
  -- the LRU of prefix keys: key -> node {key, e, prev, next}; head the most recent
  self.keys, self.nkeys, self.affine, self.spread = {}, 0, 0, 0
  for i, e in ipairs(endpoints) do
    local url, limit = e, nil
    if type(e) == "table" then url, limit = e.url, e.limit end
    if type(url) ~= "string" then error(("mirza.pool: endpoint %d has no url"):format(i), 2) end
    if limit ~= nil and (math.type(limit) ~= "integer" or limit < 1) then
      error(("mirza.pool: endpoint %d's limit must be an integer >= 1, got %s"):format(i, tostring(limit)), 2)
    end
    self.endpoints[i] = new_endpoint(url, limit or opts.limit or P.defaults.limit, i, opts.auto)
    self.endpoints[i].alone = #endpoints == 1 -- the one queued at a ceiling (queued_one)
  end
  return self
end

---The most requests the pool may ever have in flight: the fixed limits
---and the most each limiter may reach (its ceiling, and one queued at
---the server of a pool of one; else its maximum). How many workers a
---batch needs.
---@return integer
function Pool:capacity()
  local n = 0
  for _, e in ipairs(self.endpoints) do
    local lim = e.limiter
    n = n + (lim and lim.max + (e.alone and lim.ceiling and lim.max < (lim.hard or math.huge) and 1 or 0) or e.limit)
  end
  return n
end

---The server announced how many requests it serves at once (`source`:
---where it said so, "/props total_slots"): an endpoint found as it goes
---never gets more. A fixed limit stays as given.
---@param e mirza.Endpoint
---@param n integer
---@param source? string
function Pool:set_ceiling(e, n, source)
  if not e.limiter then return end
  e.limiter:set_ceiling(n, source)
  e.limit = e.limiter:get()
  self.cond:broadcast()
end

---What the server announced (mirza.capacity's answer: a ceiling, or a
---start for a server serial by default) goes to e's limiter.
---@param e mirza.Endpoint
---@param c mirza.Capacity|nil
function Pool:announce(e, c)
  if not (c and e.limiter) then return end
  if c.ceiling then return self:set_ceiling(e, c.ceiling, c.source) end
  if c.start then
    e.limiter:set_start(c.start, c.source)
    e.limit = e.limiter:get()
  end
end

---Ask e's server what it announces (mirza.capacity's `probe`) and give
---it to e's limiter (`announce`); `e.capacity` keeps the answer (false:
---none) and `e.metrics` whether its /metrics counts its queue (for
---`server_waiting`). An endpoint with a fixed limit is not asked. A probe
---that fails (no /props, refused, an HTTP error, no answer within its
---timeout) changes nothing. Inside a mirza.loop task it yields.
---@param e mirza.Endpoint
---@param opts? {api_key?: string, headers?: table, timeout?: number}
---@return mirza.Capacity|nil
function Pool:probe(e, opts)
  if not e.limiter then return nil end
  local c = require("mirza.capacity").probe(e.url, opts)
  e.capacity, e.metrics = c or false, c and c.metrics
  self:announce(e, c)
  return c
end

---Read once what each endpoint without a fixed limit announces
---(`probe`), the endpoints not asked yet each in a task of its own, all
---at once, then wait for every probe under way, this call's or another
---user's of the pool (engines sharing it): a probe's timeout at most
---(mirza.capacity's, 1 s a request). An engine over a pool calls it
---before each turn; once every endpoint was asked, it returns at once.
---A probe that fails or raises is over all the same: nothing is returned.
---@param opts? {api_key?: string, headers?: table, timeout?: number}
function Pool:read_capacity(opts)
  local under_way, current = {}, loop.current()
  for _, e in ipairs(self.endpoints) do
    if e.limiter and e.capacity == nil and not e._probe then -- on the caller's loop: it waits there
      e._probe = (current and current.loop or self.cond.loop):spawn(self.probe, self, e, opts)
    end
    if e._probe and not e._probe:done() then under_way[#under_way + 1] = e._probe end
  end
  for t in loop.as_completed(under_way) do t:join() end
end

---The server of e says `n` requests wait in its queue, and `running` (when
---it says) how many it runs (mirza.capacity's `waiting`): its limiter
---backs off (mirza.limit's `waiting`).
---@param e mirza.Endpoint
---@param n number
---@param running? number
function Pool:server_waiting(e, n, running)
  if not e.limiter then return end
  e.limiter:waiting(self.clock(), n, running)
  e.limit = e.limiter:get()
end

---Cap the limiters so that the pool never has more than `n` requests
---in flight (the open-files limit), whatever the servers announce later:
---fixed limits stay as given.
---@param n integer
function Pool:fit(n)
  local fixed, auto = 0, 0
  for _, e in ipairs(self.endpoints) do
    if e.limiter then auto = auto + 1 else fixed = fixed + e.limit end
  end
  if auto == 0 then return end
  local each = math.max(1, (n - fixed) // auto)
  for _, e in ipairs(self.endpoints) do
    if e.limiter then
      e.limiter:cap(each) -- a ceiling announced later stays under it too
      e.limit = e.limiter:get()
    end
  end
end

---An endpoint's limit for a person: "limit 16 (auto, ceiling 64 from
---/props)", "limit 4 and 1 queued (auto, ceiling 4 from /props)",
---"limit 8 (auto)" or "@8 fixed".
---@param e mirza.Endpoint
---@return string
function P.limit_text(e)
  if not e.limiter then return ("@%d fixed"):format(e.limit) end
  return ("limit %d%s (%s)"):format(e.limit, queued_one(e) > 0 and " and 1 queued" or "", e.limiter:describe())
end

---Wait (suspending the task) until the pool has room for one more
---request: fewer in flight than the limits add up to, over the endpoints
---not resting. A batch's worker waits here before it takes an item, so
---that no more items are taken than can go out.
function Pool:wait_room()
  while true do
    local now, room, wake = self.clock(), 0, nil
    for _, e in ipairs(self.endpoints) do
      if e.rest_until > now then wake = math.min(wake or math.huge, e.rest_until)
      else room = room + current_limit(e) - e.inflight end
    end
    if room > 0 then return end
    self.cond:wait(wake and (wake - now + 0.001))
  end
end

-- Whether `e` can take a request now.
local function free(e, now)
  return e.rest_until <= now and e.inflight < current_limit(e)
end

-- Whether a request that failed on the endpoints of `avoid` waits for
-- another one: some endpoint it did not fail on is healthy.
local function elsewhere(self, avoid)
  if not avoid then return false end
  for _, e in ipairs(self.endpoints) do
    if not avoid[e] and e.fails == 0 then return true end
  end
  return false
end

-- ------------------------------------------------------------ prefix keys

-- A 64-bit hash of s (FNV-1a over 8-byte words, then mixed), as 16 hex digits.
local function hash(s)
  local h, n = -3750763034362895579, #s -- FNV offset basis (as a signed 64-bit integer)
  local pad = s .. ("\0"):rep(-n % 8)
  for i = 1, #pad, 8 do
    h = (h ~ string.unpack("<i8", pad, i)) * 1099511628211
    h = h ~ (h >> 29)
  end
  h = (h ~ n) * -49064778989728563 -- a final mix (splitmix's constant), so the length counts
  return ("%016x"):format(h ~ (h >> 32))
end

-- Keys of texts hashed lately: a batch's items repeat a few preambles,
-- and looking a text up here costs C's string hash, not the Lua loop
-- (160 us for 8 KB). Emptied when it holds 256 texts.
local memo, nmemo = {}, 0

-- hash(text), remembered.
local function hash_memo(text)
  local k = memo[text]
  if k then return k end
  if nmemo >= 256 then memo, nmemo = {}, 0 end
  k = hash(text)
  memo[text], nmemo = k, nmemo + 1
  return k
end

-- The role of a message ("" for anything else).
local function role_of(m)
  return type(m) == "table" and type(m.role) == "string" and m.role or ""
end

-- The text of a message: its content, a list of parts as JSON.
local function content_of(m)
  local c = type(m) == "table" and m.content or m
  if type(c) == "string" then return c end
  if c == nil then return "" end
  return mirza.json.encode(c)
end

---The prefix key of a request: a hash of what its daemon's prompt cache
---can share with other requests. `x` is a chat request's messages (the
---leading ones — the system prompt, few-shot examples, earlier turns —
---are the prefix; when they are shorter than `bytes`, the start of the
---last message completes them) or a prompt string (its first `bytes`).
---nil when the request is shorter than `bytes` (default
---`P.defaults.prefix_bytes`): too short to gain from a cache.
---@param x table|string messages, or a prompt
---@param bytes? integer
---@return string|nil key
function P.prefix_key(x, bytes)
  bytes = bytes or P.defaults.prefix_bytes
  local text
  if type(x) == "string" then
    text = x
  elseif type(x) == "table" then
    local parts, n = {}, #x
    for i = 1, n - 1 do parts[#parts + 1] = role_of(x[i]) .. "\0" .. content_of(x[i]) .. "\0" end
    text = table.concat(parts)
    if #text >= bytes then return hash_memo(text) end
    if n > 0 then text = text .. role_of(x[n]) .. "\0" .. content_of(x[n]) end
  else
    error("mirza.pool.prefix_key: messages (a table) or a prompt (a string) expected, got " .. type(x), 2)
  end
  if #text < bytes then return nil end
  return hash_memo(text:sub(1, bytes))
end

-- The LRU's node of key, made the most recent; nil when not remembered.
function Pool:_key_node(key)
  local node = self.keys[key]
  if not node or self.keys_head == node then return node end
  -- unlink, then push at the head
  if node.prev then node.prev.next = node.next end
  if node.next then node.next.prev = node.prev end
  if self.keys_tail == node then self.keys_tail = node.prev end
  node.prev, node.next = nil, self.keys_head
  if self.keys_head then self.keys_head.prev = node end
  self.keys_head = node
  return node
end

-- Remember that key went to e (the most recent), forgetting the least
-- recently used key past `affinity_keys`.
function Pool:_remember(key, e)
  local node = self:_key_node(key)
  if node then
    node.e = e
    return
  end
  node = { key = key, e = e, next = self.keys_head }
  if self.keys_head then self.keys_head.prev = node end
  self.keys_head = node
  self.keys_tail = self.keys_tail or node
  self.keys[key], self.nkeys = node, self.nkeys + 1
  if self.nkeys > self.affinity_keys then
    local old = self.keys_tail
    self.keys_tail = old.prev
    if self.keys_tail then self.keys_tail.next = nil end
    self.keys[old.key], self.nkeys = nil, self.nkeys - 1
    Pool._forget(old)
  end
end

---The endpoint a prefix key went to last, if the pool remembers it.
---@param key string
---@return mirza.Endpoint|nil
function Pool:affine_endpoint(key)
  local node = self.keys[key]
  return node and node.e
end

-- ------------------------------------------------------------ placement
-- Where a request goes is decided by one model: what the pool believes
-- each daemon's prompt slots hold, as llama-server keeps them (a prompt
-- per slot, cached once its prefill is done: two requests that start
-- together with a new prefix both evaluate it; a busy slot is never
-- shared). Per key and endpoint: `copies` (slots holding the prefix),
-- `busy` (its requests in flight there), `cold` (those sent without a
-- copy idle, not yet past their first token). Per endpoint: `claimed`
-- (slots holding or about to hold a prompt: a copy of a prefix, or a
-- request without a key while it runs), `idle_copies` (copies no request
-- uses: evictable) and `idle` (a queue of keys in the order their copies
-- became idle).
--
-- A caller that reports its requests (`sent`, `prefilled`, `finished`:
-- mirza.batch) feeds the model, and its keys are placed by it. For a
-- caller that reports nothing (an engine, mirza.embed) the slots are
-- unknown: all the model has of a key is the endpoint it went to last,
-- which is then taken as holding its copy (that is the whole of prefix
-- affinity there). `_place` decides for both; `room_for` and `next_item`
-- ask it without taking anything.

local function count(node, field, e)
  local t = node[field]
  return t and t[e] or 0
end

-- n more (or fewer) of key's `field` on e.
local function bump(node, field, e, n)
  local t = node[field]
  if not t then
    t = {}
    node[field] = t
  end
  local v = (t[e] or 0) + n
  t[e] = v > 0 and v or nil
end

-- Key's copies on e that no request uses.
local function idle_of(node, e)
  local n = count(node, "copies", e) - count(node, "busy", e)
  return n > 0 and n or 0
end

-- Apply fn() to node's counts on e, keeping e.idle_copies right.
local function change(node, e, fn)
  local before = idle_of(node, e)
  fn()
  e.idle_copies = (e.idle_copies or 0) + idle_of(node, e) - before
end

-- The state of endpoint e (not resting) for a new request of key `node`
-- (nil: no key, or affinity off): "affine" (a copy of its prefix idle
-- there; slots unknown: the endpoint it went to last), "slot" (a slot
-- for it: a new copy there, evicting the least recently used idle copy
-- when every slot is claimed; a probed endpoint is a slot for anyone),
-- "wait" (its copies there are busy or being prefilled: follow them,
-- never a second cold copy beside the first; they wake the waiters when
-- they end), or false (full; a copy of another prefix idle for less than
-- `idle_evict` holds the only free slot while this prefix's own copies
-- are busy somewhere).
function Pool:_state(node, e, now)
  local room = e.inflight < current_limit(e)
  if not node or e.fails > 0 then return room and "slot" end
  if not node.reported then -- slots unknown: where it went last holds its copy
    return room and (node.e == e and "affine" or "slot")
  end
  local copies, busy, cold = count(node, "copies", e), count(node, "busy", e), count(node, "cold", e)
  if copies > busy then return room and "affine" or "wait" end
  if cold > 0 then return "wait" end
  local following = (node.busy and next(node.busy)) or (node.cold and next(node.cold)) -- its copies busy somewhere
  if room and ((e.claimed or 0) < e.limit or not following or self:_stale_copy(e, now)) then
    return "slot"
  end
  if busy > 0 then return "wait" end
  return false
end

-- The idle queue of e: its entries (key, that key's `used` stamp then);
-- only a key's newest entry is live (a later use re-stamps it). Compacted
-- when it holds many more entries than live ones could be.
local function idle_queue(e)
  local q = e.idle
  if not q then
    q = { head = 1, tail = 0, node = {}, stamp = {} }
    e.idle = q
  end
  return q
end

local function live(q, i, e)
  local node = q.node[i]
  return not node.dead and node.used == q.stamp[i] and idle_of(node, e) > 0
end

-- key's copy on e is idle now: it may be evicted, least recently used first.
local function push_idle(e, node)
  local q = idle_queue(e)
  q.tail = q.tail + 1
  q.node[q.tail], q.stamp[q.tail] = node, node.used
  if q.tail - q.head > 2 * e.limit + 64 then -- keep the live entries only, in order
    local n, nodes, stamps = 0, {}, {}
    for i = q.head, q.tail do
      if live(q, i, e) then n, nodes[n + 1], stamps[n + 1] = n + 1, q.node[i], q.stamp[i] end
    end
    q.node, q.stamp, q.head, q.tail = nodes, stamps, 1, n
  end
end

-- Whether e holds a copy idle for `idle_evict` seconds or more (its key
-- likely done with: a busy key may take its slot rather than wait for
-- its own copy), looking at the idle queue's oldest live entry.
function Pool:_stale_copy(e, now)
  if (e.idle_copies or 0) == 0 then return false end
  local q = e.idle
  while q and q.head <= q.tail do
    local i = q.head
    if live(q, i, e) then return now - q.stamp[i] >= self.idle_evict end
    q.node[i], q.stamp[i], q.head = nil, nil, i + 1
  end
  return false
end

-- Free a slot on e for a new copy: the least recently used idle copy of
-- another key gives its slot (the daemon evicts that prompt). Stale
-- entries are skipped; a key with more idle copies stays at the head.
-- O(1) amortized: a batch of unique prefixes evicts at every item.
function Pool._evict(e)
  local q = e.idle
  while q and q.head <= q.tail do
    local i = q.head
    if live(q, i, e) then
      local node = q.node[i]
      change(node, e, function() bump(node, "copies", e, -1) end)
      e.claimed = e.claimed - 1
      if idle_of(node, e) == 0 then q.node[i], q.stamp[i], q.head = nil, nil, i + 1 end
      break
    end
    q.node[i], q.stamp[i], q.head = nil, nil, i + 1
  end
  if q and q.head > q.tail then q.head, q.tail = 1, 0 end -- drained: from 1 again (array part)
end

-- A slot of e for a new prompt: the least recently used idle copy of
-- another key gives its own when every slot is claimed.
local function claim(e)
  if (e.claimed or 0) >= e.limit then Pool._evict(e) end
  e.claimed = (e.claimed or 0) + 1
end

---A request with prefix key `key` (or none) was sent to e (acquired): the
---ticket to pass to `prefilled`, `report` and `finished` (it carries the
---request's record for e's limiter). It reuses an idle copy of the
---prefix, or claims a slot for a new one (cold until its first token),
---evicting the least recently used idle copy of another key when every
---slot is claimed. A request without a key (too short to have one, or
---affinity off) claims a slot too, while it runs: the daemon's slot it
---takes holds no prompt another can use.
---@param key string|nil
---@param e mirza.Endpoint
---@return table ticket
function Pool:sent(key, e)
  local node, ticket = self.affinity and key ~= nil and self.keys[key], { q = e.last }
  e.last = nil
  if not node then
    claim(e)
    ticket.anon = true
    return ticket
  end
  ticket.node, node.reported = node, true
  local reuse = idle_of(node, e) > 0
  change(node, e, function() bump(node, "busy", e, 1) end)
  node.used = self.clock()
  if reuse then return ticket end
  claim(e)
  bump(node, "cold", e, 1)
  ticket.cold = true
  return ticket
end

---The request of a ticket got its first token: e has prefilled its prefix
---(the slot it claimed holds it now); requests waiting for it may go.
---@param e mirza.Endpoint
---@param ticket table `sent`'s
function Pool:prefilled(e, ticket)
  if e.limiter and ticket.q and e.open[ticket.q] then -- the start may double at first tokens: room for more
    e.limiter:first(self.clock(), ticket.q)
    self:_follow(e)
  end
  if not ticket.cold then return end
  ticket.cold = false
  local node = ticket.node
  change(node, e, function()
    bump(node, "cold", e, -1)
    bump(node, "copies", e, 1)
  end)
  self.cond:broadcast()
end

-- e's limiter moved: e's limit follows, and the tasks waiting for room look.
function Pool:_follow(e)
  if e.limiter:get() ~= e.limit then
    e.limit = e.limiter:get()
    self.cond:broadcast()
  end
end

---Whether the request of a ticket should measure its decode step (a
---request of its limiter's start round: mirza.limit's `wants_step`):
---open it with `step = true` and tell `stepped`.
---@param e mirza.Endpoint
---@param ticket table `sent`'s
---@return boolean
function Pool.wants_step(_, e, ticket)
  return e.limiter ~= nil and ticket.q ~= nil and e.limiter:wants_step(ticket.q)
end

---The request of a ticket told its decode step (`mirza.Stream:step`).
---@param e mirza.Endpoint
---@param ticket table `sent`'s
---@param dt number seconds
function Pool:stepped(e, ticket, dt)
  if not (e.limiter and ticket.q and e.open[ticket.q]) then return end
  e.limiter:step(self.clock(), ticket.q, dt)
  self:_follow(e)
end

---The request of a ticket ended (answered, failed, cancelled). A new copy
---that never got its first token gives its slot claim back, as does a
---request without a key.
---@param e mirza.Endpoint
---@param ticket table `sent`'s
function Pool:finished(e, ticket)
  local node = ticket.node
  if ticket.done then return end
  ticket.done = true
  if ticket.anon then -- its slot is free again
    e.claimed = e.claimed - 1
    self.cond:broadcast()
    return
  end
  if not node then return end
  change(node, e, function() bump(node, "busy", e, -1) end)
  node.used = self.clock()
  if ticket.cold then
    ticket.cold = false
    bump(node, "cold", e, -1)
    if not node.dead then e.claimed = e.claimed - 1 end
  end
  if not node.dead and idle_of(node, e) > 0 then push_idle(e, node) end
  self.cond:broadcast()
end

-- A key the pool forgets (its LRU): its copies are no one's now.
function Pool._forget(node)
  node.dead = true
  for e, n in pairs(node.copies or {}) do
    change(node, e, function() node.copies[e] = nil end)
    e.claimed = e.claimed - n
  end
  for e, n in pairs(node.cold or {}) do e.claimed = e.claimed - n end
end

-- Where a request of key `node` (nil: none) goes now (`_state` of each
-- endpoint): `prefer` while it has room; else the first endpoint that
-- holds an idle copy of its prefix ("affine"); else the least loaded with
-- a slot for it ("slot"; the fewest served between equals). Otherwise nil,
-- and true while it follows copies busy or being prefilled ("wait": their
-- end wakes it), and the time the next rest ends. With `avoid` (a retry)
-- and a healthy endpoint elsewhere, only healthy ones not in `avoid` are
-- candidates: a retry never spends itself on a probe.
function Pool:_place(node, now, avoid, prefer)
  if prefer and free(prefer, now) then return prefer, "prefer" end
  local healthy_only = elsewhere(self, avoid)
  local slot, waiting, wake
  for _, e in ipairs(self.endpoints) do
    if e.rest_until > now then
      wake = math.min(wake or math.huge, e.rest_until)
    elseif not (healthy_only and (avoid[e] or e.fails > 0)) then
      local st = self:_state(node, e, now)
      if st == "affine" then return e, "affine" end
      if st == "slot" and (not slot or e.inflight < slot.inflight
          or (e.inflight == slot.inflight and e.served < slot.served)) then
        slot = e
      end
      if st == "wait" then waiting = true end
    end
  end
  if slot then return slot, "slot" end
  return nil, waiting, wake
end

---Whether a request with prefix key `key` would be sent now, and how
---(`acquire`'s decision, nothing taken): "affine" (to an idle copy of its
---prefix; slots unknown: where the key went last, which has room), "new"
---(no key, the key is not remembered, or affinity is off: any endpoint
---will do), "slot" (a new copy of its prefix in a free slot), "wait" (it
---would follow its copies, busy or being prefilled) or false (no
---endpoint can take it now).
---@param key? string
---@return "affine"|"new"|"slot"|"wait"|false
function Pool:room_for(key)
  local node = self.affinity and key and self.keys[key]
  if not node then return "new" end
  local e, how = self:_place(node, self.clock())
  if e then return how end
  return how and "wait" or false
end

---The index in `items` (the next pending requests, in the order they came,
---each a table with its prefix `key` or none) of the one to send next:
---the first whose prefix an idle copy holds ("affine"), else the first
---that any endpoint will do (no key, or one new to the pool), else the
---first that takes a new copy in a free slot, else the first. One that
---would follow a copy still prefilling waits where it is: it follows once
---the prefix is cached, never as a second cold copy beside the first. A
---free slot thus takes an item whose prefix its daemon holds, where the
---next one in order would go to a daemon without its prefix. An item
---passed over `lookahead` times is taken next (none waits forever; each
---item counts its passes in its `passed` field). Without affinity, or
---`lookahead` below 2: the first.
---@param items {key?: string, passed?: integer}[]
---@param lookahead? integer
---@return integer index
function Pool:next_item(items, lookahead)
  lookahead = lookahead or 1
  if not self.affinity or lookahead < 2 or self.nkeys == 0 then return 1 end -- no key known: all are new
  local fit, fresh, slot
  for i = 1, #items do
    local it = items[i]
    if (it.passed or 0) >= lookahead then return i end
    local room = it.key and self:room_for(it.key) or "new"
    if room == "affine" then
      fit = i
      break
    end
    if room == "new" and not fresh then fresh = i end
    if room == "slot" and not slot then slot = i end
  end
  local pick = fit or fresh or slot or 1
  for i = 1, pick - 1 do items[i].passed = (items[i].passed or 0) + 1 end
  return pick
end

---@class mirza.AcquireOptions
---@field prefer? mirza.Endpoint taken whenever it is free (an engine's conversation)
---@field avoid? table<mirza.Endpoint, boolean> endpoints the request already failed on
---@field key? string the request's prefix key (`mirza.pool.prefix_key`)

---Take a slot on the best endpoint, waiting (suspending the task) while
---none is free or every endpoint rests. nil, "timeout" after `timeout`.
---`prefer` (an endpoint of this pool) is taken whenever it is free: an
---engine keeps its conversation on the daemon that holds its session
---cache while that one is healthy and has room. Then the placement model
---decides (the module's header): with a `key` (a prefix key,
---`P.prefix_key`), an endpoint holding an idle copy of its prefix (where
---it went last, for a caller that reports nothing), else the least loaded
---with a free slot (the key then goes with it), else it follows its copies
---busy or being prefilled (a caller that reports them: `sent`,
---`prefilled`, `finished`). `avoid` (a set of endpoints the request
---already failed on) sends a retry elsewhere while another endpoint is
---healthy, waiting for its slot if need be; when none is, any endpoint (a
---probe) will do. The second argument may instead be an options table
---`{prefer =, avoid =, key =}`.
---@param timeout? number seconds
---@param prefer? mirza.Endpoint|mirza.AcquireOptions
---@param avoid? table<mirza.Endpoint, boolean>
---@param key? string
---@return mirza.Endpoint|nil endpoint
---@return string? message
---@return string? code
function Pool:acquire(timeout, prefer, avoid, key)
  if type(prefer) == "table" and prefer.base == nil then -- an options table, not an endpoint
    prefer, avoid, key = prefer.prefer, prefer.avoid, prefer.key
  end
  if not self.affinity then key = nil end
  local t_end = timeout and self.clock() + timeout
  while true do
    local now = self.clock()
    local node = key and self.keys[key]
    local e, how, wake = self:_place(node, now, avoid, prefer)
    if e and node and node.e and how ~= "prefer" then -- where its key went last, or spread from there
      if e == node.e then self.affine = self.affine + 1 else self.spread = self.spread + 1 end
    end
    if e then
      e.inflight = e.inflight + 1
      e.peak = math.max(e.peak, e.inflight)
      if e.limiter then -- the request's record: the ticket of `sent` takes it, else the first report does
        local q = e.limiter:sent(now, e.inflight > e.limit) -- past it: the one queued at the server
        e.open[q], e.last = true, q
      end
      if key then self:_remember(key, e) end
      return e
    end
    local left = t_end and t_end - now
    if left and left <= 0 then return nil, "no endpoint available in time", "timeout" end
    if wake then left = math.min(left or math.huge, wake - now + 0.001) end
    self.cond:wait(left)
  end
end

-- It answered: reachable, and no longer resting or probing.
local function healthy(e)
  e.fails, e.failing_since, e.faulting = 0, nil, nil
end

-- A failure of its own: rested, longer after each one in a row. One while
-- it already rests (a request of the same wave) does not lengthen it.
function Pool:_rest(e)
  local now = self.clock()
  e.failed = e.failed + 1
  if e.fails > 0 and e.rest_until > now then return end
  e.fails = e.fails + 1
  e.failing_since = e.failing_since or now
  e.rest_until = now + retry.backoff(e.fails, self.rest, self.rest_max, 0.75, 1.25)
end

-- A server fault (an HTTP 5xx, an error frame) of request `key`: counted
-- once per request and endpoint, ever, toward the run that rests it ("5xx
-- on everything"); a rest starts a new run, so each further one takes as
-- many new requests (a long run of bad items rests it once per
-- `suspect_items` of them, not once each). A fault ends the probe of an
-- endpoint rested for its own failures (refused: it is back, and answers),
-- not of one rested for faults; one of a request already counted says
-- nothing new.
function Pool:_fault(e, key)
  if key ~= nil and e.bad[key] then return end
  if key ~= nil then
    if e.nbad >= self.suspect_keys then e.bad, e.nbad = {}, 0 end -- bounded: forget them all
    e.bad[key], e.nbad = true, e.nbad + 1
  end
  e.faults = e.faults + 1
  if e.faults >= self.suspect_items then
    e.faults = 0
    self:_rest(e)
    e.faulting = true
  elseif not e.faulting then
    healthy(e)
  end
end

-- A 429: the endpoint asks to wait `after` seconds (else `rest`): no
-- request until then, at most `rest_max`, without counting as failing.
function Pool:_pause(e, after)
  local d = math.min(after or self.rest, self.rest_max)
  local t = self.clock() + d
  if t > e.rest_until then e.rest_until = t end
end

-- The record of a request to e that ends (its ticket's, else any open
-- one: an engine or mirza.embed reports without a ticket), taken out.
local function take_record(e, ticket)
  if not e.limiter then return nil end
  local q = ticket and ticket.q
  if not (q and e.open[q]) then q = next(e.open) end
  if q then e.open[q] = nil end
  return q
end

-- What the limiter hears of a request that ended: an answer and its
-- tokens; an overload (a 429, a 503, a refused or cut connection); or
-- nothing it can use (r nil: cancelled; another failure). Its limit follows.
local OVERLOAD = { refused = "refused", closed = "cut" }
local function feed(self, e, r, ticket)
  local q = take_record(e, ticket)
  if not q then return end
  local lim, now = e.limiter, self.clock()
  local why = r and (OVERLOAD[r.code] or (r.code == "http" and (r.status == 429 or r.status == 503) and
    tostring(r.status)))
  if r and (r.ok or (r.tokens or 0) > 0) and not why then
    lim:done(now, q, r.tokens or 0, r.ttft_ms and r.ttft_ms / 1000)
  elseif why then lim:failed(now, q, why)
  else lim:dropped(now, q) end
  e.limit = lim:get()
end

---Give the slot back. `ok` true, or a failure that is the request's own
---(`blame` false: a 4xx, a 429): the endpoint answered, so it is healthy (a
---probe succeeded). `blame` true (or "endpoint") rests it; "request" (a
---server fault of request `key`: an HTTP 5xx, an error frame) counts
---toward its run (`suspect_items` different requests since its last
---success rest it).
---@param e mirza.Endpoint
---@param ok boolean
---@param blame? boolean|"endpoint"|"request" whose failure it was
---@param key? any the request (a batch item's custom_id)
function Pool:release(e, ok, blame, key)
  feed(self, e, nil)
  self:_release(e, ok, blame, key)
end

function Pool:_release(e, ok, blame, key)
  e.inflight = e.inflight - 1
  if ok then
    healthy(e)
    e.served, e.answered, e.faults = e.served + 1, true, 0
  elseif blame == "request" then self:_fault(e, key)
  elseif blame then
    self:_rest(e)
    e.faulting = nil
  else healthy(e) end
  self.cond:broadcast() -- a slot, or the pick order, changed
end

---Give the slot back with the outcome of its request `r` (`ok`, or
---`code`, `status`, `message`, `retry_after` of the failure): the pool
---decides by its class (mirza.retry) what it says about the endpoint and
---keeps what `unreachable` needs: "endpoint" rests it; a server fault
---("retry": 5xx, error frame) counts toward its run; a 429 pauses it;
---"unsupported", "item" and 408/409 leave it serving.
---@param e mirza.Endpoint
---The answer's `tokens` and `ttft_ms`, an overload (429, 503, refused,
---cut) tell the endpoint's limiter (`ticket`: `sent`'s, when there is one).
---@param r {ok?: boolean, code?: string, status?: integer, message?: string, retry_after?: number,
---  tokens?: integer, ttft_ms?: number}
---@param key? any the request: its server faults on one endpoint count once
---@param ticket? table `sent`'s
function Pool:report(e, r, key, ticket)
  feed(self, e, r, ticket)
  if r.status or r.ok then e.answered = true end
  if not r.ok then e.last_error = r.message or r.code end
  if r.code == "refused" then
    e.refused, e.refused_since = e.refused + 1, e.refused_since or self.clock()
  else
    e.refused, e.refused_since = 0, nil
  end
  if r.ok then return self:_release(e, true, false, key) end
  local c = retry.classify(r.code, r.status)
  if r.code == "http" and r.status == 429 then self:_pause(e, r.retry_after) end
  self:_release(e, false, c.class == "endpoint" or (c.fault and "request"), key)
end

---Give the slot back without a verdict (its request was cancelled).
---@param e mirza.Endpoint
---@param ticket? table `sent`'s
function Pool:abandon(e, ticket)
  feed(self, e, nil, ticket)
  e.inflight = e.inflight - 1
  self.cond:broadcast()
end

-- "URL: its last error" (the core's messages start with the URL already).
local function failure(e, default)
  local msg, base = e.last_error or default, mirza.redact_url(e.base) -- as the core's messages show it
  return msg:find(base, 1, true) == 1 and msg or ("%s: %s"):format(base, msg)
end

---nil while an endpoint answered once or may yet; else why none can: no
---endpoint ever answered and each refused connections for at least
---`unreachable_after` seconds (a port typo, a daemon not started). Only
---outcomes given to `report` count.
---@return string|nil why "URL: message" per endpoint
function Pool:unreachable()
  local now, why = self.clock(), {}
  for _, e in ipairs(self.endpoints) do
    if e.answered or not e.refused_since or now - e.refused_since < self.unreachable_after then return nil end
    why[#why + 1] = failure(e, "refused")
  end
  return table.concat(why, "; ")
end

---How long every endpoint has been failing (resting or probing), in
---seconds; nil while one is healthy.
---@return number|nil seconds
---@return string? why "URL: last error" per endpoint
function Pool:down_for()
  local since, why = -math.huge, {}
  for _, e in ipairs(self.endpoints) do
    if not e.failing_since then return nil end
    since = math.max(since, e.failing_since)
    why[#why + 1] = failure(e, "failing")
  end
  return self.clock() - since, table.concat(why, "; ")
end

---A line per endpoint: base, in flight/limit, how the limit was found,
---served, failures, resting (or paused by a 429).
---@return string
function Pool:describe()
  local out, now = {}, self.clock()
  for _, e in ipairs(self.endpoints) do
    out[#out + 1] = ("%s %d/%d (%s) served %d failed %d%s"):format(mirza.redact_url(e.base), e.inflight, e.limit,
      e.limiter and e.limiter:describe() or "fixed", e.served, e.failed,
      e.rest_until > now and (" %s %.1fs"):format(e.fails > 0 and "resting" or "paused", e.rest_until - now) or "")
  end
  return table.concat(out, "\n")
end

return P
