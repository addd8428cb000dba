-- A server on a fake clock, for mirza.limit's specs and its curves in
-- docs/batch.md: `slots` requests decode at once (more wait in its queue,
-- their first token late), the n decoding make `rate(n)` tokens a second
-- between them (n counts those in their prefill too: a step carries
-- their prompts), each one's first token comes `ttft` seconds after it
-- got a slot and a step (a token at their pace) later, its second a
-- step after that (told as `step` for the requests the limiter asks it
-- of, `no_steps`: none). A client keeps
-- `limit` requests in flight (a mirza.limit, or a fixed number) until
-- `items` are done. Fixed steps of `dt` seconds.
local S = {}

-- Tokens a second, n decoding, from points {n, rate} (log-log between them).
function S.curve(points)
  return function(n)
    if n <= points[1][1] then return points[1][2] * n / points[1][1] end
    for i = 2, #points do
      local a, b = points[i - 1], points[i]
      if n <= b[1] then
        local f = math.log(n / a[1]) / math.log(b[1] / a[1])
        return math.exp(math.log(a[2]) + f * math.log(b[2] / a[2]))
      end
    end
    local z = points[#points]
    return z[2]
  end
end

S.shapes = {
  -- llama -np 64 on the sim: each stream 50 tokens/s, more wait
  slots64 = { slots = 64, rate = function(n) return 50 * n end, ttft = 0.1, tokens = 20 },
  slots4 = { slots = 4, rate = function(n) return 50 * n end, ttft = 0.1, tokens = 20 },
  serial = { slots = 1, rate = function(n) return 50 * n end, ttft = 0.1, tokens = 20 },
  -- vLLM-like: a step of 10 ms + 0.2 ms per sequence, 256 at most
  saturating = { slots = 256, rate = function(n) return n / (0.01 + 0.0002 * n) end, ttft = 0.05, tokens = 128 },
  -- the H100 curve of issue 41 (llama-server CUDA -np 256, 128-token answers)
  peaking = { slots = 256, rate = S.curve { { 1, 254 }, { 4, 990 }, { 16, 1640 }, { 64, 1400 }, { 256, 1090 } },
    ttft = 0.03, tokens = 128 },
}

-- The lengths of answers: `tokens`, or between tokens/4 and tokens*7/4 (seeded).
local function lengths(n, tokens, vary, seed)
  local out, x = {}, seed or 1
  for i = 1, n do
    if vary then
      x = (x * 1103515245 + 12345) % 2147483648
      out[i] = math.max(1, math.floor(tokens * (0.25 + 1.5 * x / 2147483648)))
    else
      out[i] = tokens
    end
  end
  return out
end

---Run `items` requests against shape `sh` keeping `limit` in flight (a
---number, or a mirza.limit). Returns the wall time and a trace of the
---limit {t, limit} at each change. `opts.other(t)`: requests of another
---client decoding at time t (sharing the server's rate); `opts.slots(t)`:
---the slots free for this client at time t (another one holds the rest);
---`opts.fail(t, n)` true: a request sent at t with n in flight is refused
---(429); `opts.vary`: answers of different lengths; `opts.extra`: that
---many more than the limit in flight, told as such (`sent`'s `extra`: one
---queued at the server, as mirza.pool sends at a ceiling).
function S.run(sh, items, limit, opts)
  opts = opts or {}
  local dt = opts.dt or 0.005
  local lens = lengths(items, sh.tokens, opts.vary, opts.seed)
  local t, sent, finished, running, queue, trace = 0, 0, 0, {}, {}, {}
  local lim = type(limit) == "table" and limit or nil
  local function cap() return lim and lim:get() or limit end
  local last
  while finished < items do
    while #running + #queue < cap() + (opts.extra or 0) and sent < items do
      sent = sent + 1
      local extra = #running + #queue >= cap() -- past the limit: queued at the server on purpose (mirza.pool)
      local r = { k = lens[sent], t0 = t, got = 0, q = lim and lim:sent(t, extra and not opts.no_extra) }
      r.stepping = lim and not opts.no_steps and lim:wants_step(r.q) -- mirza.pool asks it as it sends
      if opts.fail and opts.fail(t, #running + #queue) then
        if lim then lim:failed(t, r.q, "429") end
        finished, sent = finished, sent - 1
        break
      end
      queue[#queue + 1] = r
    end
    local slots = opts.slots and opts.slots(t) or sh.slots
    while #running < slots and #queue > 0 do
      local r = table.remove(queue, 1)
      r.slot = t
      running[#running + 1] = r
    end
    local other = opts.other and opts.other(t) or 0
    -- a step carries every running sequence, those still in their prefill too (llama-server batches
    -- prompts with the others' tokens): the pace of all of them
    local batch = #running + other
    local per = batch > 0 and sh.rate(batch) / batch or 0
    t = t + dt
    for i = #running, 1, -1 do
      local r = running[i]
      if t >= r.slot + sh.ttft then
        r.got = r.got + per * dt
        if not r.first and r.got >= 1 then -- its first token: after the prefill, at the pace of the others
          r.first, r.first_exact = t, t - (r.got - 1) / per
          if lim and not opts.no_first then lim:first(t, r.q) end
        end
        if r.stepping and r.got >= 2 and r.got < r.k then -- its second token: its step, as read when it came
          r.stepping = false
          lim:step(t, r.q, t - (r.got - 2) / per - r.first_exact)
        end
        if r.got >= r.k then
          table.remove(running, i)
          finished = finished + 1
          if lim then lim:done(t, r.q, r.k, r.first - r.t0) end
        end
      end
    end
    local now = cap()
    if now ~= last then
      trace[#trace + 1] = { t, now }
      last = now
    end
    if t > (opts.timeout or 7200) then error("simulation did not end: " .. finished .. " of " .. items) end
  end
  return t, trace
end

---The best fixed limit of `candidates` for the shape: its time and the limit.
function S.best_fixed(sh, items, candidates, opts)
  local best, at
  for _, n in ipairs(candidates) do
    local w = S.run(sh, items, n, opts)
    if not best or w < best then best, at = w, n end
  end
  return best, at
end

return S
