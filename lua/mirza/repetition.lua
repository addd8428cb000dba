--- mirza.repetition: cut a degenerate loop in streamed text.
---
--- A small model sometimes falls into a loop ("Wait, let me reconsider."
--- forever) and burns its whole token budget. The guard watches the streamed
--- text and reports the loop early so the engine can close the request and
--- stop the daemon's compute. Three rules, on two views of the text:
---
--- Segments: the text is cut into lines and sentences (at "\n", and after
--- . ! ? … followed by a space). A segment's key is its lower-cased text with
--- whitespace collapsed, list markers ("- ", "* ", "12. ") and trailing
--- punctuation removed. Segments with fewer than `min_letters` letters
--- (blank lines, `end`, `}`, "ok", "- item") are ignored altogether.
---  * cycle: the last segments form a cycle of 1..`max_cycle` segments
---    repeated `repeats` times in a row (A A A..., A B A B...).
---  * count: one prose segment occurs `count` times among the last `window`
---    segments (a loop whose cycle varies, like "Wait, let me reconsider."
---    between ever-different attempts). Code-like lines (braces, `;`, `=`,
---    calls `f(`, lines led by `return`/`end`/`if`/... without a final stop)
---    and lines inside ``` fences are never counted by this rule: guard
---    clauses legitimately repeat.
--- Characters: the last ~1 KiB of text, lower-cased, whitespace collapsed.
---  * phrase: its tail is periodic with a unit of at most `max_phrase` bytes,
---    repeated `phrase_repeats` times and covering `phrase_min_chars` bytes
---    ("and so on and so on ..." with no line break). A unit with fewer than
---    `phrase_min_letters` letters ("))))", "la la", "== ") never counts; a
---    unit holding a line break ("- item\n", "end\n") is a loop of lines
---    too short for the segment rules and needs `line_repeats` repetitions.
---
--- Why these defaults: a refrain in a song or poem comes back 3-4 times, with
--- other lines in between, and a chorus line rarely more than twice in a row;
--- a loop, once entered, never leaves. So a cycle must come back 6 times in a
--- row, and a sentence 8 times within 32 segments: double the refrain's
--- count, yet a loop of 2-3 short sentences is cut after ~300 tokens.
---
--- `repetition.new(opts)` is the plain guard object (`guard:feed(chunk)`);
--- `repetition.stage` wraps one guard per watched channel over an event
--- iterator. The module itself holds no state (but a memo of a number
--- derived from the thresholds).

local M = {}

--- Default thresholds; any of them can be overridden in `opts`.
M.DEFAULTS = {
  repeats = 6,             -- cycle rule: repetitions in a row
  max_cycle = 4,           -- cycle rule: longest cycle, in segments
  count = 8,               -- count rule: occurrences...
  window = 32,             -- ...among the last `window` segments
  min_letters = 6,         -- shorter segments are ignored
  phrase_repeats = 8,      -- phrase rule: repetitions of the unit
  phrase_min_chars = 80,   -- phrase rule: bytes covered by the repetitions
  max_phrase = 64,         -- phrase rule: longest unit, in bytes
  phrase_min_letters = 4,  -- phrase rule: letters the unit needs
  line_repeats = 32,       -- phrase rule, unit with a line break: repetitions
}

-- Words that lead a line of code; such a line without a final stop is code.
local CODE_WORDS = {}
for w in ([[return end local else elif elseif fi done break continue pass import from def
  fn func function let const var if for while case switch goto print raise throw try
  catch except finally defer go val]]):gmatch("%S+") do CODE_WORDS[w] = true end

local byte, concat, find, gsub, lower, sub = string.byte, table.concat, string.find, string.gsub,
  string.lower, string.sub

local ELLIPSIS = "\226\128\166"
local BULLET = "\226\128\162"

-- Byte tests, C locale (as Lua's %a, %p, %s): a pattern with a class
-- costs ~140 instructions a byte (it is tried at every position), a
-- plain find a few, a byte test ~60. Every segment and every delta pays
-- these, so the hot checks below use them; each is equivalent to the
-- pattern it replaces (the differential spec holds the verdicts).
local PUNCT, SPACE = {}, {}
for c = 0, 255 do
  local ch = string.char(c)
  if c >= 33 and c <= 126 and not ch:find("%w") then PUNCT[c] = true end
  if ch:find("%s") then SPACE[c] = true end -- \t \n \v \f \r and space
end

-- find(s, "[\t-\r]") ~= nil: a control space (\t \n \v \f \r). A plain
-- find costs ~1,200 instructions whatever the length: the pattern is
-- cheaper on a delta, five plain finds on a sentence.
local function has_ctl_space(s)
  if #s < 40 then return find(s, "[\t-\r]") end
  return find(s, "\n", 1, true) or find(s, "\t", 1, true) or find(s, "\r", 1, true)
    or find(s, "\v", 1, true) or find(s, "\f", 1, true)
end

---@class mirza.RepetitionGuard
---@field triggered boolean
---@field line string|nil   the repeated line, sentence or phrase
---@field count integer|nil how many times it came back
---@field rule string|nil   "cycle", "count" or "phrase"
local Guard = {}
Guard.__index = Guard

-- Whether s holds at least n letters (ASCII or any byte of a multi-byte
-- character): the bytes up to the nth letter, no new string.
local function has_letters(s, n)
  if n <= 0 then return true end
  for i = 1, #s do
    local c = byte(s, i)
    if c >= 128 or (c >= 97 and c <= 122) or (c >= 65 and c <= 90) then
      n = n - 1
      if n <= 0 then return true end -- <=: a threshold may be fractional
    end
  end
  return false
end

local BULLET_AT_START = "^" .. BULLET .. " ?"

-- The comparison key of a segment: "" when it is to be ignored. The same
-- key as the reference's eight gsubs (tests/lua/repetition_ref.lua), each
-- run only when a byte test says it can change something: a segment comes
-- every few tokens, and most need none of them.
local function key_of(seg, min_letters)
  local s = lower(seg)
  if has_ctl_space(s) or find(s, "  ", 1, true) then s = gsub(s, "%s+", " ") end
  if byte(s, 1) == 32 then s = sub(s, 2) end
  if byte(s, -1) == 32 then s = sub(s, 1, -2) end
  local b = byte(s, 1)
  if b == 226 then
    s = gsub(s, BULLET_AT_START, "")
    b = byte(s, 1)
  end
  if b == 45 or b == 42 or b == 43 or b == 62 then -- - * + >
    s = gsub(s, "^[%-%*+>]+ ", "")
    b = byte(s, 1)
  end
  if b and b >= 48 and b <= 57 then s = gsub(s, "^%d+[%.%)] ", "") end
  if find(s, ELLIPSIS, 1, true) then s = gsub(s, ELLIPSIS, "...") end
  local e = #s -- gsub(s, "[%p ]+$", "")
  while e > 0 do
    local c = byte(s, e)
    if c == 32 or PUNCT[c] then e = e - 1 else break end
  end
  if e < #s then s = sub(s, 1, e) end
  if not has_letters(s, min_letters) then return "" end
  return s
end

-- Whether a (trimmed) segment looks like a line of code rather than prose.
local function is_code(text)
  if find(text, "{", 1, true) or find(text, "}", 1, true) or find(text, ";", 1, true)
    or find(text, "=", 1, true) or find(text, "`", 1, true) then return true end -- [{};=`]
  if find(text, "(", 1, true) and find(text, "[%w_]%(") then return true end
  local first = text:match("^[%a_#]+")
  return first ~= nil and CODE_WORDS[first:lower()] == true and not text:find("[%.!%?]$")
end

-- K: a period p passes only with a periodic tail of at least
-- max(phrase_repeats * p, phrase_min_chars) bytes, so of p + K bytes.
-- Computed once per set of thresholds (a batch makes two guards per item;
-- the loop was most of a short item's guard cost): a pure memo, at most
-- 64 sets, no state a reload could miss.
local k_of, nk = {}, 0
local function phrase_k(repeats, min_chars, max_phrase)
  local id = repeats .. "/" .. min_chars .. "/" .. max_phrase
  local K = k_of[id]
  if K then return K end
  K = 32
  for p = 1, max_phrase do
    K = math.min(K, math.max((repeats - 1) * p, min_chars - p))
  end
  if nk >= 64 then k_of, nk = {}, 0 end
  k_of[id], nk = K, nk + 1
  return K
end

---A new guard. `opts` overrides fields of `repetition.DEFAULTS`.
---@param opts? table
---@return mirza.RepetitionGuard
function M.new(opts)
  local g = setmetatable({ triggered = false, _segs = {}, _kc = {}, _fence = false,
    _pparts = {}, _pn = 0, _plen = 0, _open_stop = false,          -- pending text
    _tparts = {}, _tpn = 0, _tstored = 0, _tlen = 0, _recent = "", -- normalised tail
    _cands = {} }, Guard)
  for k, v in pairs(M.DEFAULTS) do g[k] = (opts and opts[k]) or v end
  g._cap = math.max(1024, g.max_phrase * g.line_repeats * 2)
  g._K = phrase_k(g.phrase_repeats, g.phrase_min_chars, g.max_phrase)
  g._W = g.max_phrase + math.max(g._K, 1) + 64
  return g
end

function Guard:_trigger(rule, line, count)
  self.triggered, self.rule, self.line, self.count = true, rule, line, count
  return true
end

-- Cycle rule: is the tail of the segment list periodic with a short cycle?
function Guard:_check_cycle()
  local segs, n = self._segs, #self._segs
  for p = 1, self.max_cycle do
    local m = 0
    while n - m - p >= 1 and segs[n - m].key == segs[n - m - p].key do m = m + 1 end
    local cycles = (m + p) // p
    if cycles >= self.repeats then
      return self:_trigger("cycle", segs[n - p + 1].text, cycles)
    end
  end
  return false
end

-- Count rule: the newest prose segment, counted in the window.
function Guard:_check_count()
  local segs = self._segs
  local last = segs[#segs]
  if not last.prose then return false end
  local c = self._kc[last.key] -- its occurrences among the segments kept (_segment keeps the count)
  if c >= self.count then return self:_trigger("count", last.text, c) end
  return false
end

-- One complete segment: track ``` fences, then apply the segment rules.
function Guard:_segment(raw)
  local a, text = find(raw, "%S"), ""
  if a then -- trimmed (the reference's two gsubs)
    local z = #raw
    while true do
      if SPACE[byte(raw, z)] then z = z - 1 else break end
    end
    text = (a == 1 and z == #raw) and raw or sub(raw, a, z)
  end
  local b1 = byte(text, 1)
  if (b1 == 96 or b1 == 126) and (sub(text, 1, 3) == "```" or sub(text, 1, 3) == "~~~") then
    self._fence = not self._fence
    return false
  end
  local key = key_of(text, self.min_letters)
  if key == "" then return false end
  local segs, kc = self._segs, self._kc
  segs[#segs + 1] = { key = key, text = text, prose = not self._fence and not is_code(text) }
  kc[key] = (kc[key] or 0) + 1
  if #segs > math.max(self.window, self.repeats * self.max_cycle) then
    local gone = table.remove(segs, 1).key
    local left = kc[gone] - 1
    kc[gone] = left > 0 and left or nil
  end
  return self:_check_cycle() or self:_check_count()
end

-- A sentence stop (. ! ? …, maybe closing quotes/brackets) before a space:
-- the end of find(buf, "[%.!%?][\"')%]]*%s", pos), the pattern tried only
-- where a plain find saw a stop (it would be tried at every byte).
local STOP_AT = "^[%.!%?][\"')%]]*%s"
local function stop_end(buf, pos)
  local d, x, q = find(buf, ".", pos, true), find(buf, "!", pos, true), find(buf, "?", pos, true)
  while d or x or q do
    local i = d
    if x and (not i or x < i) then i = x end
    if q and (not i or q < i) then i = q end
    local _, e = find(buf, STOP_AT, i)
    if e then return e end
    if i == d then d = find(buf, ".", i + 1, true)
    elseif i == x then x = find(buf, "!", i + 1, true)
    else q = find(buf, "?", i + 1, true) end
  end
  return nil
end

-- The end of find(buf, ELLIPSIS .. "%s", pos): an ellipsis before a space.
local function ellipsis_end(buf, pos)
  local i = find(buf, ELLIPSIS, pos, true)
  while i do
    if SPACE[byte(buf, i + 3)] then return i + 3 end
    i = find(buf, ELLIPSIS, i + 1, true)
  end
  return nil
end

-- Closing quotes and brackets that may follow a stop: " ' ) ]
local CLOSER = { [34] = true, [39] = true, [41] = true, [93] = true }

-- Whether s ends in a stop, maybe with closers (find(s,
-- "[%.!%?][\"')%]]*$")), or in a partial ellipsis (find(s,
-- "\226[\128-\191]*$")): a space after it would end a sentence.
local function ends_open(s)
  local e = #s
  while e > 0 and CLOSER[byte(s, e)] do e = e - 1 end
  local c = byte(s, e)
  if c == 46 or c == 33 or c == 63 then return true end
  e = #s
  while e > 0 do
    c = byte(s, e)
    if c < 128 or c > 191 then break end
    e = e - 1
  end
  return byte(s, e) == 226
end

-- The text not yet cut into segments, as one string (the parts joined).
function Guard:_take_pending()
  local p = concat(self._pparts, "", 1, self._pn)
  self._pparts, self._pn, self._plen, self._open_stop = {}, 0, 0, false
  return p
end

-- Keep `rest` as the pending text; note whether it ends in a stop (maybe
-- with closers, or a partial ellipsis) that a space would complete.
function Guard:_set_pending(rest)
  local parts = self._pparts
  for i = self._pn, 1, -1 do parts[i] = nil end
  parts[1] = rest
  self._pn, self._plen = 1, #rest
  self._open_stop = ends_open(rest)
end

-- Cut complete segments off the pending text and check each. Incremental:
-- the pending text is a list of parts, joined and scanned (as a whole,
-- like the one-string version) only when the chunk may complete a segment:
-- it holds a line break or a stop, or a space follows a pending stop.
-- Otherwise a segment end cannot lie in it (each ends with a space or "\n").
function Guard:_segments(chunk)
  local n = self._pn + 1
  self._pparts[n], self._pn, self._plen = chunk, n, self._plen + #chunk
  if find(chunk, "[\n%.!%?\226]") or (self._open_stop and find(chunk, "%s")) then
    -- Segment ends: a line break or a stop. Each kind's next end is
    -- searched once and kept while it lies ahead (a match of one kind never
    -- straddles an end of another), so a chunk holding many segments — the
    -- deltas that arrived together — is scanned once, not once per segment.
    local buf, pos = concat(self._pparts, "", 1, n), 1
    local nl, st, el -- the next end of each kind; false: none left
    while true do
      if nl == nil or (nl and nl < pos) then nl = find(buf, "\n", pos, true) or false end
      if st == nil or (st and st < pos) then st = stop_end(buf, pos) or false end
      if el == nil or (el and el < pos) then el = ellipsis_end(buf, pos) or false end
      local e = nl
      if st and (not e or st < e) then e = st end
      if el and (not e or el < e) then e = el end
      if not e then break end
      if self:_segment(sub(buf, pos, e)) then return true end
      pos = e + 1
    end
    self:_set_pending(pos == 1 and buf or sub(buf, pos))
  elseif self._open_stop and find(chunk, "[^\"')%]\128-\191]") then
    self._open_stop = false
  end
  if self._plen > 4096 then -- a runaway line: judge what we have
    return self:_segment(self:_take_pending())
  end
  return false
end

-- The unit of the periodic tail as it first appeared (the loop's start is
-- found by extending the last `r` units backwards byte by byte), rotated to
-- begin on a word, for the report: "and so on", not "so on and".
local function readable(t, p, r)
  local k = #t - r * p
  while k >= 1 and t:byte(k) == t:byte(k + p) do k = k - 1 end
  local unit = t:sub(k + 1, k + p)
  -- a line loop starts on a line; a phrase on the first word start
  local i = unit:find("\n", 1, true)
  if not i and k >= 1 and not t:sub(k, k):find("%s") then i = unit:find("%s") end
  if i and i < #unit then unit = unit:sub(i + 1) .. unit:sub(1, i) end
  return (unit:gsub("^%s+", ""):gsub("%s+$", ""))
end

-- How many times the last `p` bytes of t[lo..m] repeat back to back at its end.
local function repeats_at_end(t, m, lo, p)
  local unit, r = sub(t, m - p + 1, m), 1
  while m - (r + 1) * p + 1 >= lo and sub(t, m - (r + 1) * p + 1, m - r * p) == unit do r = r + 1 end
  return r, unit
end

-- The normalised tail as one string (its parts joined, cut to its length).
function Guard:_tail_string()
  local t = concat(self._tparts, "", 1, self._tpn)
  if #t > self._tlen then t = sub(t, -self._tlen) end
  self._tparts, self._tpn = { t }, 1
  self._tstored = #t
  return t
end

-- The verdict on period p with r repetitions of `unit` (see _check_phrase):
-- true/false decides, nil goes on to the next period.
function Guard:_judge_phrase(p, r, unit)
  if r >= self.phrase_repeats and r * p >= self.phrase_min_chars then
    if not has_letters(unit, self.phrase_min_letters) then return false end
    if find(unit, "\n", 1, true) and r < self.line_repeats then return false end
    return self:_trigger("phrase", readable(self:_tail_string(), p, r), r)
  end
  return nil
end

-- Phrase rule: the smallest period of the tail decides. A trivial unit
-- (too few letters) ends the search: its multiples are just as trivial. A
-- unit spanning a line break is a loop of lines, which the segment rules
-- judge; only a very long run of one (a loop of lines too short for them,
-- like "Wait.") is cut here. This is the reference form, over the whole
-- tail; _check_phrase finds the same verdict cheaply.
function Guard:_check_phrase_full()
  local t = self:_tail_string()
  local n = #t
  for p = 1, math.min(self.max_phrase, n // 2) do
    local r, unit = repeats_at_end(t, n, 1, p)
    local v = self:_judge_phrase(p, r, unit)
    if v ~= nil then return v end
  end
  return false
end

-- Phrase rule, incrementally. A period p can only pass the thresholds if
-- the tail is periodic with period p over at least p + K bytes (K from the
-- thresholds, see new), so the last K bytes occur again p bytes earlier:
-- one plain find over the recent bytes lists the candidate periods, and
-- only those are counted, smallest first, with the same verdicts.
function Guard:_check_phrase()
  local K, n = self._K, self._tlen
  if K < 1 then return self:_check_phrase_full() end
  if n <= K then return false end -- no period can pass: p + K > n
  local R = self._recent
  local m = #R
  local pmax = math.min(self.max_phrase, n // 2)
  local last = m - K + 1
  local key = sub(R, last, m)
  local lo = m - n + 1 -- the tail's first byte in R (<= 1 when R lies in the tail)
  local i = find(R, key, math.max(1, lo, last - pmax), true)
  if i == last then return false end -- the usual case: no candidate
  local cands, nc = self._cands, 0
  while i and i < last do
    nc = nc + 1
    cands[nc] = last - i
    i = find(R, key, i + 1, true)
  end
  for c = nc, 1, -1 do -- found right to left in R: smallest period last
    local p = cands[c]
    local r, unit = repeats_at_end(R, m, math.max(1, lo), p)
    if lo < 1 and m - (r + 1) * p + 1 < 1 then -- the run may go on before R: count on the tail
      local t = self:_tail_string()
      r = repeats_at_end(t, #t, 1, p)
    end
    local v = self:_judge_phrase(p, r, unit)
    if v ~= nil then return v end
  end
  return false
end

-- Whitespace runs become one space, or one "\n" when they hold a line break.
local function squash(ws)
  return find(ws, "\n", 1, true) and "\n" or " "
end

-- Replace the last byte of the tail (a space that becomes a line break).
function Guard:_set_last(ch)
  local parts, n = self._tparts, self._tpn
  parts[n] = sub(parts[n], 1, -2) .. ch
  self._recent = sub(self._recent, 1, -2) .. ch
end

-- Append a chunk to the normalised character tail, bounded: its logical
-- length `_tlen` follows the one-string rule exactly (past `cap`, keep the
-- last 3/4 cap), while the bytes are kept as parts, joined now and then,
-- and the last few hundred bytes as `_recent` for the phrase rule.
function Guard:_append_tail(chunk)
  local c = lower(chunk)
  if has_ctl_space(c) or find(c, "  ", 1, true) then c = gsub(c, "%s+", squash) end
  local lb, fb = byte(self._recent, -1), byte(c, 1)
  if (lb == 32 or lb == 10) and (fb == 32 or fb == 10) then
    self:_set_last((lb == 10 or fb == 10) and "\n" or " ")
    c = sub(c, 2)
  end
  local len = self._tlen + #c
  if len > self._cap then len = self._cap * 3 // 4 end
  self._tlen = len
  if c == "" then return end
  local n = self._tpn + 1
  self._tparts[n], self._tpn, self._tstored = c, n, self._tstored + #c
  if self._tstored > 2 * self._cap then self:_tail_string() end
  local r = self._recent .. c
  if #r > 2 * self._W then r = sub(r, -self._W) end
  self._recent = r
end

---Feed a chunk of streamed text. Once triggered, the guard stays triggered
---and keeps returning the same report.
---@param chunk string
---@return boolean triggered
---@return string|nil line the repeated line/sentence/phrase (original text)
---@return integer|nil count how many times it came back
function Guard:feed(chunk)
  if not self.triggered and chunk ~= "" then
    self:_append_tail(chunk)
    if not self:_segments(chunk) then self:_check_phrase() end
  end
  return self.triggered, self.line, self.count
end

---Feed a whole text at once (tests, post-hoc checks).
---@param text string
---@return boolean triggered
---@return string|nil line
---@return integer|nil count
function Guard:check(text)
  self:feed(text)
  if not self.triggered and self._plen > 0 then self:_segment(self:_take_pending()) end
  return self.triggered, self.line, self.count
end

local DEFAULT_CHANNELS = { think = true }

---The guard as a pipeline stage. Watches `opts.channels` (a set of event
---types, default `{think=true}` like the seed; add `text=true` to watch the
---answer too) with one guard per channel. On a loop it calls
---`opts.on_cut(cut)` first (the engine closes the request there), then
---emits the chunk that completed the loop, then
---`{type="cut", reason="repetition", line=, count=, channel=, rule=}`,
---and ends: no further upstream event is read. A plain iterator (no
---coroutine): an event costs one call and a table lookup.
---@param upstream mirza.EventIter
---@param opts? table thresholds (`DEFAULTS`), `channels`, `on_cut`
---@return mirza.EventIter
function M.stage(upstream, opts)
  opts = opts or {}
  local channels, guards = opts.channels or DEFAULT_CHANNELS, {}
  local over, cut = false, nil -- over: nothing more is read; cut: still to emit
  return function()
    if over then
      local c = cut
      cut = nil
      return c
    end
    local ev = upstream()
    if ev == nil then
      over = true
      return nil
    end
    local ch = ev.type
    if channels[ch] then
      local text = ev.text
      if type(text) == "string" then
        local g = guards[ch]
        if not g then
          g = M.new(opts)
          guards[ch] = g
        end
        local hit, line, count = g:feed(text)
        if hit then
          cut = { type = "cut", reason = "repetition", line = line, count = count, channel = ch, rule = g.rule }
          over = true
          if opts.on_cut then opts.on_cut(cut) end
        end
      end
    end
    return ev
  end
end

return M
