--- The repetition guard as it was before issue 12 (one-string tail and
--- pending text, rescanned on every delta): the reference that
--- repetition_spec's differential test holds the incremental guard to.
--- Kept verbatim but for the pipeline stage; not part of the library.
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
--- iterator. The module itself holds no state.

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

local ELLIPSIS = "\226\128\166"
local BULLET = "\226\128\162"

---@class mirza.RepetitionGuard
---@field triggered boolean
---@field line string|nil   the repeated line, sentence or phrase
---@field count integer|nil how many times it came back
---@field rule string|nil   "cycle", "count" or "phrase"
local Guard = {}
Guard.__index = Guard

local function letters(s)
  return select(2, s:gsub("[%a\128-\255]", ""))
end

-- The comparison key of a segment: "" when it is to be ignored.
local function key_of(seg, min_letters)
  local s = seg:lower():gsub("%s+", " ")
  s = s:gsub("^ ", ""):gsub(" $", "")
  s = s:gsub("^" .. BULLET .. " ?", ""):gsub("^[%-%*+>]+ ", ""):gsub("^%d+[%.%)] ", "")
  s = s:gsub(ELLIPSIS, "..."):gsub("[%p ]+$", "")
  if letters(s) < min_letters then return "" end
  return s
end

-- Whether a (trimmed) segment looks like a line of code rather than prose.
local function is_code(text)
  if text:find("[{};=`]") or text:find("[%w_]%(") then return true end
  local first = text:match("^[%a_#]+")
  return first ~= nil and CODE_WORDS[first:lower()] == true and not text:find("[%.!%?]$")
end

---A new guard. `opts` overrides fields of `repetition.DEFAULTS`.
---@param opts? table
---@return mirza.RepetitionGuard
function M.new(opts)
  local g = setmetatable({ triggered = false, _pending = "", _tail = "", _segs = {}, _fence = false }, Guard)
  for k, v in pairs(M.DEFAULTS) do g[k] = (opts and opts[k]) or v end
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
  local c = 0
  for i = 1, #segs do
    if segs[i].key == last.key then c = c + 1 end
  end
  if c >= self.count then return self:_trigger("count", last.text, c) end
  return false
end

-- One complete segment: track ``` fences, then apply the segment rules.
function Guard:_segment(raw)
  local text = raw:gsub("^%s+", ""):gsub("%s+$", "")
  if text:find("^```") or text:find("^~~~") then
    self._fence = not self._fence
    return false
  end
  local key = key_of(text, self.min_letters)
  if key == "" then return false end
  local segs = self._segs
  segs[#segs + 1] = { key = key, text = text, prose = not self._fence and not is_code(text) }
  if #segs > math.max(self.window, self.repeats * self.max_cycle) then table.remove(segs, 1) end
  return self:_check_cycle() or self:_check_count()
end

-- The end of the first segment in `buf` from `init`: a line break, or a
-- sentence stop (. ! ? …, maybe closing quotes/brackets) before a space.
local function segment_end(buf, init)
  local best = buf:find("\n", init, true)
  local _, e = buf:find("[%.!%?][\"')%]]*%s", init)
  if e and (not best or e < best) then best = e end
  _, e = buf:find(ELLIPSIS .. "%s", init)
  if e and (not best or e < best) then best = e end
  return best
end

-- Cut complete segments off the pending text and check each.
function Guard:_segments(chunk)
  local buf, pos = self._pending .. chunk, 1
  while true do
    local e = segment_end(buf, pos)
    if not e then break end
    if self:_segment(buf:sub(pos, e)) then return true end
    pos = e + 1
  end
  self._pending = buf:sub(pos)
  if #self._pending > 4096 then -- a runaway line: judge what we have
    local seg = self._pending
    self._pending = ""
    return self:_segment(seg)
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

-- Phrase rule: the smallest period of the tail decides. A trivial unit
-- (too few letters) ends the search: its multiples are just as trivial. A
-- unit spanning a line break is a loop of lines, which the segment rules
-- judge; only a very long run of one (a loop of lines too short for them,
-- like "Wait.") is cut here.
function Guard:_check_phrase()
  local t = self._tail
  local n = #t
  for p = 1, math.min(self.max_phrase, n // 2) do
    local unit, r = t:sub(n - p + 1, n), 1
    while n - (r + 1) * p >= 0 and t:sub(n - (r + 1) * p + 1, n - r * p) == unit do r = r + 1 end
    if r >= self.phrase_repeats and r * p >= self.phrase_min_chars then
      if letters(unit) < self.phrase_min_letters then return false end
      if unit:find("\n", 1, true) and r < self.line_repeats then return false end
      return self:_trigger("phrase", readable(t, p, r), r)
    end
  end
  return false
end

-- Whitespace runs become one space, or one "\n" when they hold a line break.
local function squash(ws)
  return ws:find("\n", 1, true) and "\n" or " "
end

-- Append a chunk to the normalised character tail (bounded).
function Guard:_append_tail(chunk)
  local c = chunk:lower():gsub("%s+", squash)
  local t = self._tail
  local last, first = t:sub(-1), c:sub(1, 1)
  if (last == " " or last == "\n") and (first == " " or first == "\n") then
    t = t:sub(1, -2) .. ((last == "\n" or first == "\n") and "\n" or " ")
    c = c:sub(2)
  end
  t = t .. c
  local cap = math.max(1024, self.max_phrase * self.line_repeats * 2)
  if #t > cap then t = t:sub(-(cap * 3 // 4)) end
  self._tail = t
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
  if not self.triggered and self._pending ~= "" then
    local seg = self._pending
    self._pending = ""
    self:_segment(seg)
  end
  return self.triggered, self.line, self.count
end

return M
