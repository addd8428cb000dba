--- mirza.limit: how many requests to keep in flight at one endpoint,
--- found by measuring what it serves (issue 41).
---
--- Pure logic: no clock, no I/O. The caller tells it what happens, with
--- the time (`sent`, `done`, `failed`, `dropped`), and asks `get()`. The
--- pool (mirza.pool) keeps one per endpoint without a fixed `@N`.
---
--- What it measures. A window of completions (at least about one item's
--- duration, so that answers of different lengths average out) gives
--- the endpoint's token rate by Little's law, item by item: an item of k
--- tokens that took W seconds while n requests were in flight on average
--- says the endpoint makes n*k/W tokens a second. The window's rate is
--- sum(n*k) / sum(W), paired with the load it was measured at (the
--- token-weighted mean of n). A finished item's n is the in-flight
--- count averaged over its own life, so a window that straddles a change
--- of limit pairs each rate with the load that produced it.
---
--- How it moves (BBR's phases over TCP's slow start, with a hill climb):
---   start   the limit doubles a round at a time: the requests a
---           doubling lets out are a round, and each measures the
---           server's decode step (its first token to the next: `step`,
---           a token of every sequence the server runs); once all told
---           theirs, the round's rate is its load / its median step. A
---           round whose rate grew at least load^`min_gain` over the
---           round before's doubles again; else the limit holds at the
---           load of the best round's rate. A round whose requests
---           waited for a slot holds at the round before (the server
---           queues). A caller that tells no steps has its rounds
---           decided by their first tokens' median time (the server
---           samples a first token at the end of a step of its whole
---           batch, so that time grows with the load as the step does;
---           blurred by the prefill: g >= `fast_gain` doubles, below
---           goes back to the round before). Past the rounds (and for a
---           caller that tells no first tokens, or first tokens that take
---           longer than an answer) the windows decide: the limit doubles
---           after each window while the rate grew by a real share of the
---           load's growth (an elasticity of at least `min_gain`:
---           doubling the load gives 7 % more or better); it stops where
---           the curve flattens or falls, and steps back to the load of
---           the best rate seen. A server that scales is filled within a
---           few first tokens, not a window per doubling.
---   hold    the limit stays; every `probe_every` windows (8 times
---           that at the ceiling or the maximum the start reached) it
---           tries 25 % more, then 20 % less, measured on the requests
---           sent since
---           (two windows): more is kept when it serves 2 % more, less
---           when it serves no less than 98 % (fewer requests for the
---           same rate). A probe that loses doubles the wait before the
---           next (up to 8 times), one that wins resets it; one up whose
---           rate grew at least half as fast as the load starts again
---           (room came back). So it follows a server whose load changes
---           (another client).
---   queue   items that waited for their first token (ttft past twice its
---           floor and 50 ms) in a quarter of a window: the server queues
---           them (its slots are full): the limit becomes the load that
---           did not wait.
---   waiting the server's own count of requests it queues (vLLM's, or
---           llama-server's deferred: `waiting`), above 0 twice in a
---           row: the limit becomes the requests in flight less those,
---           once a window.
---   back    a 429, 503, refused or cut connection halves it (once per
---           window, as TCP's loss), at least `min`.
--- A window whose load never reached the limit (the batch ending, too
--- few items) raises nothing: what more load would do is not known.
local M = {}

M.defaults = {
  initial = 8,       -- the first limit without a ceiling
  initial_ceiling = 16, -- the first limit under a ceiling (at most the ceiling: slots a server announced)
  min = 1,
  max = 256,         -- the limit without a ceiling announced
  min_window = 0.25, -- seconds: a window lasts at least this, and about one item's duration
  max_window = 30,
  min_items = 2,     -- completions a window needs
  min_gain = 0.1,    -- start: doubling continues while rate grows at least load^min_gain
  fast_gain = 0.5,   -- start: a doubling at first tokens while the rate grows at least load^fast_gain
  probe_every = 3,   -- hold: windows between two probes
  probe_up = 1.25,
  probe_down = 0.8,
  up_gain = 1.02,    -- a probe up is kept when it serves this much more
  down_keep = 0.98,  -- a probe down is kept when it serves at least this much
  queue_share = 0.25, -- share of a window's items that waited for their first token: queueing
  backoff = 0.5,
}

---@class mirza.Limit
---@field limit integer the limit now
---@field min integer
---@field max integer the ceiling (announced, else `defaults.max`)
---@field ceiling integer|nil what the server announced
---@field source string|nil where the ceiling came from ("/props")
---@field mode "start"|"hold"|"probe"
---@field why string what moved it last ("start", "first tokens", "rate", "ceiling", "queue", "429"...)
---@field inflight integer
---@field best_rate number the best window rate seen (tokens/s)
---@field trace fun(now: number, r: table, before: integer, self: mirza.Limit)|nil called after each decision
---  (r: the window's rate, load, n, queued, full; a round's load, n, queued, ttft and gain), for tuning and tests
local Limit = {}
Limit.__index = Limit

---A limiter. `opts`: `M.defaults`' keys, and `ceiling` (what the server
---announced: the most it ever gets) with `source` (where it was read).
---@param opts? {initial?: integer, min?: integer, max?: integer, ceiling?: integer, source?: string,
---  min_window?: number, probe_every?: integer}
---@return mirza.Limit
function M.new(opts)
  opts = opts or {}
  local self = setmetatable({}, Limit)
  for k, v in pairs(M.defaults) do self[k] = opts[k] or v end
  self.inflight, self.area, self.t = 0, 0, nil
  self.mode, self.why, self.windows, self.best_rate, self.skip = "start", "start", 0, 0, 0
  self.every, self.epoch = self.probe_every, 0
  self.ttfts, self.nttft, self.dur = {}, 0, nil
  self.levels = {} -- window results in start: {load, rate}
  self:_new_window(nil)
  self.limit = math.max(self.min, math.min(self.initial, self.max))
  if opts.ceiling then self:set_ceiling(opts.ceiling, opts.source) end
  return self
end

---The limit now.
---@return integer
function Limit:get()
  return self.limit
end

-- Clamp n into [min, max] as an integer.
function Limit:_clamp(n)
  return math.max(self.min, math.min(self.max, math.floor(n + 0.5)))
end

---The server announced its capacity: the limit never goes past it.
---Before the first request, the start moves to `initial_ceiling` (at most
---the ceiling).
---@param n integer
---@param source? string where it was read ("/props total_slots")
function Limit:set_ceiling(n, source)
  if math.type(n) ~= "integer" or n < 1 then error("mirza.limit: a ceiling is an integer >= 1", 2) end
  self.ceiling, self.source, self.max = n, source, math.min(n, self.hard or n)
  if self.mode == "start" and not self.rounds then self.limit = self.initial_ceiling end
  self.limit = math.min(self.limit, n)
end

---The most it may ever reach whatever the server announces (the
---process's open files: mirza.pool's `fit`).
---@param n integer
function Limit:cap(n)
  self.hard = math.max(1, math.min(self.hard or n, n))
  self.max = math.min(self.max, self.hard)
  self.limit = math.min(self.limit, self.max)
end

---A start the server's kind suggests (MTPLX: 1, serial by default),
---taken before the first window only; `source` says why.
---@param n integer
---@param source? string
function Limit:set_start(n, source)
  if self.mode ~= "start" or self.rounds then return end
  self.limit, self.start_source = self:_clamp(n), source
  self.first_limit = self.limit
end

-- The in-flight integral up to now (for each item's mean load).
function Limit:_advance(now)
  if self.t then self.area = self.area + self.inflight * (now - self.t) end
  self.t = now
end

function Limit:_new_window(now)
  self.w = { t0 = now, n = 0, lk = 0, k = 0, wsum = 0, queued = 0, peak = self.inflight or 0, fails = 0 }
end

-- A round of `need` requests let out at `now`: what they tell (their
-- first tokens, their steps) as it comes.
local function new_round(now, need)
  return { t = now, need = need, sent = 0, ttfts = {}, steps = {}, firsts = 0, told = 0 }
end

---A request was sent: its record, to pass to `done`, `failed` or
---`dropped`. `extra`: sent past the limit on purpose, to wait in the
---server's queue for the next free slot (mirza.pool at the ceiling): its
---wait for a first token says nothing of the server's room.
---@param now number
---@param extra? boolean
---@return table request
function Limit:sent(now, extra)
  self:_advance(now)
  self.inflight = self.inflight + 1
  local w = self.w
  w.t0 = w.t0 or now
  if self.inflight > w.peak then w.peak = self.inflight end
  if not self.rounds and self.mode == "start" then -- the first requests: the first round
    self.rounds = {}
    self.round = new_round(now, self.limit)
  end
  local round = self.round
  if round and not extra and not round.frozen and round.sent < round.need then round.sent = round.sent + 1
  else round = nil end
  return { t0 = now, a0 = self.area, epoch = self.epoch, round = round, extra = extra or nil }
end

---A request's first token came (the server gave it a slot and its
---prefill is done). Optional: the start then doubles at first tokens
---(rounds), and a queue is cut to the requests that got theirs, not
---guessed from the window.
---@param now number
---@param q table `sent`'s
function Limit:first(now, q)
  if q.first then return end
  q.first = now
  self.started = (self.started or 0) + 1
  local round = q.round
  if not round or round ~= self.round then return end
  if not round.frozen then -- the round: those sent until its first token, at the load then
    round.need, round.frozen, round.load = round.sent, true, self.inflight
  end
  round.ttfts[#round.ttfts + 1] = now - q.t0
  self:_told(now, round, true, not q.stepping)
end

---Whether the caller should measure the request's decode step (its
---first delta to the next one read, read as they come: mirza.open's
---`step`) and tell it (`step`): a request of a round of the start. Once
---asked, a round that its first tokens do not decide waits for its step
---or its end.
---@param q table `sent`'s
---@return boolean
function Limit:wants_step(q)
  if not q.round or q.round ~= self.round then return false end
  q.stepping = true
  return true
end

---The request's decode step came: the time from its first delta to the
---next one read (the server's step at its load: a token of each sequence
---it runs), after `first`.
---@param now number
---@param q table `sent`'s
---@param dt number seconds
function Limit:step(now, q, dt)
  local round = q.round
  if q.step or not q.first or not round or round ~= self.round then return end
  q.step = dt
  if dt > 0 then round.steps[#round.steps + 1] = dt end
  self:_told(now, round, false, true)
end

-- A request of the round told its first token (`first`), or all it will
-- (`all`: its step, or its first token when it measures none, or its
-- end). Once all have their first token, those may decide the round;
-- else it ends once all told all.
function Limit:_told(now, round, first, all)
  if first then round.firsts = round.firsts + 1 end
  if all then round.told = round.told + 1 end
  if round.frozen and round.firsts >= round.need then self:_round_end(now, round) end
end

-- The median of a list of numbers (sorted in place).
local function median(t)
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) // 2] or (t[n // 2] + t[n // 2 + 1]) / 2
end

-- The rate a round's steps say (load / their median step), when at
-- least half of its requests told one.
local function rate_of(round)
  if #round.steps == 0 or #round.steps * 2 < #round.ttfts then return nil end
  return round.load / median(round.steps)
end

-- A round's requests all got their first token (or ended), or all told
-- their step too. The first tokens: a server with room samples a first
-- token at the end of a step of its whole batch, so the time to it grows
-- with the load as the step does, and the endpoint's rate (load / step)
-- grew at least load^g where the round's median time to a first token
-- grew at most load^(1 - g). They decide at once when the round's
-- requests waited for a slot (the last first token past twice the first
-- and 50 ms: the server queues; hold at the round before). Else the
-- steps decide, once all told theirs (a prefill that does not grow with
-- the load blurs the first tokens' g near a bend: a vLLM-like curve's
-- 0.4 read as 0.15-0.3, like the H100 knee's 0): the rate is the round's
-- load / its median step, and the limit doubles while it grew at least
-- load^min_gain, else holds at the load of the best round's rate. (The
-- next round cannot go out at the first tokens, before the steps: its
-- prompts would join the batch the steps are measured on.) A caller
-- that tells no steps: the first tokens decide, with g >= fast_gain to
-- double; below, back to the round before, and the windows, which
-- measure the rate itself, go on.
function Limit:_round_end(now, round)
  local prev = self.rounds[#self.rounds]
  if not round.ttft then
    round.ttft = median(round.ttfts)
    round.queued = round.ttfts[#round.ttfts] > 2 * round.ttfts[1] + 0.05
    round.g = 1 -- the first round: sent together, none waited
    if prev and round.load > prev.load then
      round.g = 1 - math.log(round.ttft / prev.ttft) / math.log(round.load / prev.load)
    end
  end
  local all = round.told >= round.need
  local rate, before = all and rate_of(round), prev and prev.rate -- a round's steps are all in when it ends
  local stepped = rate and before and round.load > prev.load
  local g = stepped and math.log(rate / before) / math.log(round.load / prev.load) or round.g
  if not (all or round.queued) then return end -- the steps will say
  self.round = nil
  if self.mode ~= "start" or self.fast_off then return end
  round.rate = rate
  self.rounds[#self.rounds + 1] = round
  if self.trace then
    self.trace(now, { n = #round.ttfts, queued = round.queued and 1 or 0, load = round.load, rate = rate or 0,
      ttft = round.ttft, gain = g }, self.limit, self)
  end
  if not round.queued and g >= (stepped and self.min_gain or self.fast_gain) then
    if self.limit < self.max then return self:_double(now) end
    self.fast_off = true -- the rate grew all the way to the ceiling (or the maximum)
    self.mode, self.why, self.windows, self.base = "hold", self.ceiling and "ceiling" or "max", 0, nil
    self.every = 8 * self.probe_every
    return
  end
  self.fast_off, self.why = true, "first tokens"
  if round.queued then
    if prev then self.limit, self.skip = self:_clamp(math.min(self.limit, prev.load)), 1 end
    self.mode, self.why, self.windows, self.base = "hold", "queue", 0, nil
  elseif stepped then -- the rate itself flattened or fell: the load of the best round's rate, and hold
    local best = prev
    for _, r in ipairs(self.rounds) do
      if r.rate and r.rate > best.rate then best = r end
    end
    self.limit, self.skip = self:_clamp(math.min(self.limit, best.load)), 1
    self.mode, self.why, self.windows, self.base = "hold", "steps", 0, nil
  elseif prev then
    self.limit, self.skip = self:_clamp(math.min(self.limit, prev.load)), 1
  end
end

-- Double in the start, and let the requests the new room lets out be a
-- round (`first` decides once they all got their first token).
function Limit:_double(now)
  local before = self.limit
  self.limit = self:_clamp(self.limit * 2)
  local need = self.limit - math.max(before, self.inflight)
  self.round = need > 0 and not self.fast_off and new_round(now, need) or nil
end

-- The request ends: its mean load over its life. A round's request that
-- ends before it told all it would has told all it can.
function Limit:_end(now, q)
  self:_advance(now)
  self.inflight = self.inflight - 1
  if q.first then self.started = self.started - 1 end
  if q.round and q.round == self.round and not (q.first and (q.step or not q.stepping)) then
    self:_told(now, q.round, not q.first, true) -- it told all it can
  end
  local dt = now - q.t0
  if dt <= 0 then return self.inflight + 1, 0 end
  return (self.area - q.a0) / dt, dt
end

-- The ttft floor: the least of the last 64 first tokens.
function Limit:_floor()
  local f = math.huge
  for i = 1, #self.ttfts do f = math.min(f, self.ttfts[i]) end
  return f
end

---A request ended with an answer of `tokens` tokens, its first after
---`ttft` seconds (nil: not known).
---@param now number
---@param q table `sent`'s
---@param tokens integer
---@param ttft? number
function Limit:done(now, q, tokens, ttft)
  local load, dt = self:_end(now, q)
  local w = self.w
  local counts = self.mode ~= "probe" or q.epoch == self.epoch -- a probe measures its own requests only
  if counts and dt > 0 and tokens and tokens > 0 then
    w.n, w.lk, w.k, w.wsum = w.n + 1, w.lk + load * tokens, w.k + tokens, w.wsum + dt
    w.load = (w.load or 0) + load * tokens
    self.dur = self.dur and (0.8 * self.dur + 0.2 * dt) or dt
  end
  if ttft and not q.extra then
    self.nttft = self.nttft % 64 + 1
    self.ttfts[self.nttft] = ttft
    if ttft > 2 * self:_floor() + 0.05 then w.queued = w.queued + 1 end
  end
  self:_tick(now)
end

---A request ended in a failure that says the endpoint is overloaded or
---going away (429, 503, refused, cut): the limit halves, once a window.
---@param now number
---@param q table `sent`'s
---@param why string what it was ("429", "503", "refused", "closed")
function Limit:failed(now, q, why)
  self:_end(now, q)
  local w = self.w
  w.fails = w.fails + 1
  if w.fails == 1 then
    self.limit = self:_clamp(math.max(self.min, self.limit * self.backoff))
    self.mode, self.why, self.windows, self.base, self.skip = "hold", why, 0, nil, 1
  end
  self:_tick(now)
end

---The server says `n` requests wait in its queue (its /metrics: vLLM's
---num_requests_waiting, llama-server's requests_deferred), and `running`
---(when it says) how many it runs. Twice in a row above 0 (not a request
---between two of its steps): the limit becomes what it runs, else the
---requests in flight less those waiting (an overestimate: in flight counts
---requests on their way, and answers not read yet), at least `min`, once
---a window.
---@param now number
---@param n number
---@param running? number
function Limit:waiting(now, n, running)
  local before = self.seen_waiting
  self.seen_waiting = n > 0
  if not (n > 0 and before) or self.w.cut then return end
  local to = self:_clamp(running and running > 0 and running or self.inflight - n)
  if to >= self.limit then return end
  self.w.cut = true
  self.limit, self.mode, self.why, self.windows, self.base, self.skip = to, "hold", "waiting", 0, nil, 1
  if self.trace then self.trace(now, { n = 0, queued = n, load = self.inflight, rate = 0, full = true }, to, self) end
end

---A request ended and says nothing of the endpoint (cancelled, the
---item's own error).
---@param now number
---@param q table `sent`'s
function Limit:dropped(now, q)
  self:_end(now, q)
end

-- The window's length: about one item's duration, within bounds.
function Limit:_window_len()
  local len = math.max(self.min_window, math.min(self.max_window, self.dur or 0))
  return self.mode == "probe" and 2 * len or len
end

-- Close the window when it is long enough and has enough items; then decide.
function Limit:_tick(now)
  local w = self.w
  if not w.t0 or now - w.t0 < self:_window_len() or w.n < self.min_items then return end
  local r = { rate = w.lk / w.wsum, load = w.load / w.k, n = w.n, queued = w.queued,
    full = w.peak >= self.limit, t = now }
  self:_new_window(now)
  self.w.peak = self.inflight
  self.windows = self.windows + 1
  if r.rate > self.best_rate then self.best_rate = r.rate end
  local before = self.limit
  self:_decide(r)
  if self.trace then self.trace(now, r, before, self) end
end

-- The load of the best rate among the windows of the start.
function Limit:_best_level()
  local best
  for _, l in ipairs(self.levels) do
    if not best or l.rate > best.rate then best = l end
  end
  return best
end

function Limit:_decide(r)
  if self.skip > 0 then -- the window after a cut still holds the requests sent before it
    self.skip = self.skip - 1
    return
  end
  if r.queued >= self.queue_share * r.n then -- the server queues: what did not wait is its size
    -- those under way now (and the one that just ended), when first tokens are told
    -- (a moment when few have theirs yet, just after a turnover, is not the server's size: at least
    -- the window's load that did not wait)
    local served = math.max(self.started and self.started + 1 or 0, r.load * (1 - r.queued / r.n))
    self.limit = self:_clamp(math.max(self.min, math.min(self.limit, served)))
    self.mode, self.why, self.windows, self.base, self.skip = "hold", "queue", 0, nil, 1
    return
  end
  local f = Limit["_" .. self.mode]
  f(self, r)
end

-- The latest window of the start measured at a load well below `load`.
function Limit:_below(load)
  for i = #self.levels, 1, -1 do
    if self.levels[i].load * 1.2 < load then return self.levels[i] end
  end
end

-- Slow start: double while the rate keeps up with the load.
function Limit:_start(r)
  local prev = self:_below(r.load)
  self.levels[#self.levels + 1] = r
  if prev then
    local gain = math.log(r.rate / prev.rate) / math.log(r.load / prev.load)
    -- once the curve bends, a window per doubling
    if gain < self.fast_gain then self.fast_off = true end
    self.linear = gain >= self.fast_gain
    if gain < self.min_gain then
      local best = self:_best_level()
      self.limit = self:_clamp(best.load)
      self.mode, self.why, self.windows, self.base = "hold", "rate", 0, best.rate
      return
    end
  end
  if not r.full then return end
  if self.round and not self.fast_off then -- a round at first tokens decides the next doubling
    if r.t - self.round.t < self:_window_len() then return end
    self.fast_off, self.round = true, nil -- its first tokens take longer than an answer: the windows decide
  end
  if self.limit >= self.max then -- the rate grew all the way: a probe below is seldom worth its windows
    self.mode, self.why, self.windows, self.base = "hold", self.ceiling and "ceiling" or "max", 0, r.rate
    self.every = 8 * self.probe_every
  elseif r.load >= 0.75 * self.limit or self.linear then -- the last doubling shows in this window (or the
    self:_double(r.t)                                       -- rate grew as fast as the load so far): the next one
  end
end

-- Hold: keep the base rate current, probe every `probe_every` windows.
function Limit:_hold(r)
  if not r.full then return end -- the load was not the limit's: says nothing of it
  self.base = self.base and (0.5 * self.base + 0.5 * r.rate) or r.rate
  if self.windows < self.every then return end
  self.up = not self.up
  local to = self:_clamp(self.limit * (self.up and self.probe_up or self.probe_down))
  if to == self.limit then
    self.up = not self.up
    to = self:_clamp(self.limit * (self.up and self.probe_up or self.probe_down))
    if to == self.limit then return end
  end
  self.from, self.limit, self.mode, self.epoch = self.limit, to, "probe", self.epoch + 1
  self:_new_window(nil) -- from its first request on
end

-- A probe's window: keep the new limit, or go back.
function Limit:_probe(r)
  local keep
  if self.limit > self.from then -- one that waited says the server queues: a rate by Little's law overstates it
    keep = r.full and r.queued == 0 and r.rate >= self.up_gain * self.base
  else keep = r.rate >= self.down_keep * self.base end
  if keep and self.limit > self.from and r.rate >= self.base * (self.limit / self.from) ^ self.fast_gain then
    -- more load, and the rate grew at least half as fast: room came back (another client left): start again
    self.mode, self.why, self.every, self.linear, self.fast_off = "start", "rate", self.probe_every, true, nil
    self.levels, self.rounds = { { load = self.from, rate = self.base }, r }, {}
    self:_double(r.t)
    return
  elseif keep then -- the curve moved or was not known there: look again soon
    self.base, self.why, self.every = r.rate, "rate", self.probe_every
  else -- a probe that loses costs its windows: each one that loses waits twice as long for the next
    self.limit, self.every = self.from, math.min(8 * self.probe_every, 2 * self.every)
  end
  self.mode, self.windows = "hold", 0
end

---How it was found, for a person: "auto, ceiling 64 from /props" or
---"auto".
---@return string
function Limit:describe()
  if self.ceiling then
    return ("auto, ceiling %d%s"):format(self.ceiling, self.source and (" from " .. self.source) or "")
  end
  if self.start_source then return ("auto, started at %d: %s"):format(self.first_limit, self.start_source) end
  return "auto, no ceiling announced"
end

return M
