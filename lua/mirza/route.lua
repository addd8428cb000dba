--- mirza.route: where a turn's output goes.
---
--- A voice assistant speaks the answer and shows the thinking elsewhere, so
--- the think channel and the answer channel go to different sinks. A sink is
--- a Lua function, called `(text, ev)` (a function of the text alone just
--- ignores the event); a C function such as `print` or `io.write`, called
--- with the text only; a file handle (`io.stdout`, an opened file), written
--- with `f:write(text)` (the error sink adds a line break); or an object with
--- `:write(text, ev)` (`route.buffer()`). Each channel
--- is delivered "token" (every delta), "sentence" (complete sentences, for a
--- speech engine) or "whole" (once, when the channel ends). Errors go to the
--- error sink and never into the answer; the partial answer is still
--- delivered (and kept in the result) before the error is reported.
---
--- The sentence splitter (`route.splitter()`) knows French and English:
--- a "." or a run of ! and ? followed by a space ends a sentence, which is
--- handed over as soon as that space is seen (a delta ending in ". "), not
--- with the next word; … and ..., closing marks after the terminator, a
--- French quote left open, "etc." (`M.MAY_END`) and a number before the dot
--- ("le 12. arrondissement") end one only when the next word does not start
--- in lower case (so "Well... maybe" and « Viens ! » dit-il stay whole,
--- and wait for that word); closing quotes and brackets stay with their sentence
--- (French « … » with its spaces too); abbreviations (Mr., Dr., M., Mme.,
--- e.g., i.e., cf., p. ex., vs., ...), initials (J. R. R.), and list numbers
--- ("12. " at a line start) do not end one; a number like 3.14 or 1,000.5
--- never does (no space after the dot); a line break always does. Known
--- limit: a lone capital before a dot reads as an initial ("plan B. Fin"
--- stays one sentence). Semicolons and colons do not end a sentence.
---
--- `route.inline(events, opts)` is the seed's rendering: one stream of
--- strings with the thinking between `<think>` and `</think>`.
local M = {}

--- Lower-cased abbreviations (without their final dot) that never end a
--- sentence, even before a capital. "etc." is not one: before a capital it
--- ends the sentence. Extend it through `opts.abbreviations`.
M.ABBREVIATIONS = {}
for a in ([[mr mrs ms dr st mt jr sr prof pr mme mlle mm mgr me m vs cf ex e.g i.e
  fig réf ref vol no n° chap art env approx av apr ca cie dept gen gov lt col sgt
  capt rev p pp al ed eds éd op cit ibid vv nos resp cap]]):gmatch("%S+") do M.ABBREVIATIONS[a] = true end
M.ABBREVIATIONS["me"] = nil -- "Tell me. Then..." ends; Maître is written Me without a dot

--- Lower-cased abbreviations that end a sentence before a capital and not
--- before a lower-case word ("etc. and", "Apple Inc. is"): a sentence
--- ending in one is handed over once the next word is seen.
M.MAY_END = { etc = true, inc = true, ltd = true, corp = true }

local result = require "mirza.result"
local byte, concat, find, sub = string.byte, table.concat, string.find, string.sub
local keep, join = result.push, result.join -- a channel is a rope too (mirza.result)

local ELLIPSIS = "\226\128\166"
-- Closing marks that stay with the sentence they follow.
local CLOSERS = { ['"'] = true, ["'"] = true, [")"] = true, ["]"] = true, ["}"] = true,
  ["\194\187"] = true, ["\226\128\157"] = true, ["\226\128\153"] = true } -- » ” ’
-- Spaces French puts inside « » and before ! ? : ; (no-break, narrow no-break).
local NBSP = { [" "] = true, ["\194\160"] = true, ["\226\128\175"] = true, ["\226\128\137"] = true }

-- The UTF-8 character at byte i; nil past the end or when the character is
-- not complete yet (a stream can split one between two deltas).
local function char_at(s, i)
  local b = s:byte(i)
  if not b then return nil end
  local len = b < 0x80 and 1 or b < 0xE0 and 2 or b < 0xF0 and 3 or 4
  if i + len - 1 > #s then return nil end
  return s:sub(i, i + len - 1)
end

-- Whether a UTF-8 character is a lower-case letter (ASCII, Latin-1, Latin
-- Extended-A: enough for French and English).
local function is_lower(ch)
  if #ch == 1 then
    local b = byte(ch)
    return b >= 97 and b <= 122
  end
  local ok, cp = pcall(utf8.codepoint, ch)
  if not ok then return false end
  if cp >= 0xDF and cp <= 0xFF then return cp ~= 0xF7 end
  if cp >= 0x100 and cp <= 0x17F then return cp % 2 == 1 end
  return false
end

---@class mirza.Splitter
---@field _buf string
local Splitter = {}
Splitter.__index = Splitter

---A new sentence splitter.
---@param opts? {abbreviations?: table<string, boolean>}
---@return mirza.Splitter
function M.splitter(opts)
  local abbrev = setmetatable({}, { __index = M.ABBREVIATIONS })
  for k, v in pairs(opts and opts.abbreviations or {}) do abbrev[k:lower()] = v end
  return setmetatable({ _buf = "", _parts = {}, _pn = 0, _pos = 1, _wait = false, _quote = 0, _abbrev = abbrev },
    Splitter)
end

-- The end of a terminator run starting at i (. ! ? … in any mix), or nil
-- when there is no terminator at i.
local function run_end(s, i)
  local j = i - 1
  while true do
    local b = byte(s, j + 1)
    if b == 46 or b == 33 or b == 63 then j = j + 1 -- . ! ?
    elseif b == 226 and sub(s, j + 1, j + 3) == ELLIPSIS then j = j + 3
    else break end
  end
  return j >= i and j or nil
end

-- Extend a sentence end over closing quotes/brackets, French spaced ones
-- too; nil when a space that may precede a » ends the text (more is needed).
local function closers_end(s, k)
  while true do
    local b = byte(s, k + 1)
    if b == 10 then return k end
    if b == 32 then -- the usual case: a plain space, not one before a »
      local b2 = byte(s, k + 2)
      if b2 and b2 ~= 194 then return k end
    end
    local c = char_at(s, k + 1)
    if c and CLOSERS[c] then
      k = k + #c
    elseif c and NBSP[c] and char_at(s, k + 1 + #c) == "\194\187" then
      k = k + #c + 2
    elseif c and NBSP[c] and k + #c >= #s then
      return nil
    else
      return k
    end
  end
end

-- The word before the dot at `dot` (in sentence s[from..]): [%w.'] and
-- UTF-8 bytes.
local function word_before(s, from, dot)
  local k = dot - 1
  while k >= from do
    local b = byte(s, k)
    if not (b >= 48 and b <= 57 or b >= 65 and b <= 90 or b >= 97 and b <= 122 or b == 46 or b == 39
      or b >= 128) then break end
    k = k - 1
  end
  return sub(s, k + 1, dot - 1)
end

-- Whether a single "." at `dot` (in sentence s[from..]) is not a sentence
-- end whatever follows: an abbreviation, an initial, a list number.
function Splitter:_no_stop(s, from, dot)
  local word = word_before(s, from, dot)
  if word == "" then return false end
  local low = word:lower()
  if self._abbrev[low] then return true end
  if word:find("^%u$") then return true end                      -- J. R. R. Tolkien, M. Dupont
  if word:find("^%a%.%a[%.%a]*$") then return true end           -- U.S., a.m.
  if word:find("^%d+$") and s:sub(from, dot - 1):find("^%s*%d+$") then return true end -- "12. " list item
  return false
end

-- French quotes left open by `depth` (those of the sentences before) and
-- the text t: a » may follow a terminator inside them, after a space.
local function quote_depth(depth, t)
  if not find(t, "\194[\171\187]") then return depth end
  local _, opens = t:gsub("\194\171", "")
  local _, closes = t:gsub("\194\187", "")
  return math.max(0, depth + opens - closes)
end

-- A terminator run s[i..j] followed by a space or a tab: true when that
-- is the end whatever comes next, so a sentence is handed over as soon as
-- its space is seen, not with the next delta (at 5 tokens/s, 200 ms
-- sooner); false when it never is (an abbreviation, an initial, a list
-- number); nil when the next word's case decides (see _decide): an
-- ellipsis ("Well... maybe"), "etc." ("etc. and" goes on), a number
-- ("le 12. arrondissement"), a French quote left open (a » may follow
-- the space). It reads nothing past the space, so the split is the same
-- whatever the chunks: a "." or a run of ! and ? then a space ends the
-- sentence even before a lower-case word ("C'est fini. écoute").
function Splitter:_seen(s, from, i, j)
  local one_dot = j == i and byte(s, i) == 46
  if one_dot then
    if self:_no_stop(s, from, i) then return false end
    local word = word_before(s, from, i)
    if M.MAY_END[word:lower()] or find(word, "^%d+$") then return nil end -- "etc. and", "le 12. arrondissement"
  elseif find(sub(s, i, j), "[%.\226]") then
    return nil
  end
  if quote_depth(self._quote, sub(s, from, i)) > 0 then return nil end
  return true
end

-- Decide whether the terminator run s[i..j] ends the sentence that starts
-- at `from`. Returns the sentence's last byte and the next sentence's first
-- byte; `false` when it does not end there; nil when more text is needed.
function Splitter:_decide(s, from, i, j)
  local after = byte(s, j + 1)
  if after == 32 or after == 9 then -- the end may be seen already
    local seen = self:_seen(s, from, i, j)
    if seen == false then return false end
    if seen then return j, j + 1 + #s:match("^%s*", j + 1) end
  end
  local k = closers_end(s, j)
  if not k then return nil end
  local ws_from = k + 1
  if ws_from > #s then return nil end
  local ws = s:match("^%s+", ws_from)
  if not ws then return false end
  local q = ws_from + #ws
  if ws:find("\n", 1, true) then return k, q end
  local c = char_at(s, q)
  if not c then return nil end
  if is_lower(c) then return false end
  if j == i and s:sub(i, i) == "." and self:_no_stop(s, from, i) then return false end
  return k, q
end

local function trim(s)
  local a, z = byte(s, 1), byte(s, -1)
  if a and a > 32 and z > 32 then return s end -- nothing to trim (no %s byte is above 32)
  return (s:gsub("^%s+", ""):gsub("%s+$", ""))
end

-- Whether s ends inside a UTF-8 character (a delta can split one).
local function incomplete_tail(s)
  local n = #s
  for k = 1, math.min(4, n) do
    local b = string.byte(s, n - k + 1)
    if b < 0x80 then return false end
    if b >= 0xC0 then return (b < 0xE0 and 2 or b < 0xF0 and 3 or 4) > k end
  end
  return false
end

-- The buffered text as one string (the parts appended since the last scan
-- joined to it).
function Splitter:_text()
  local n = self._pn
  if n > 0 then
    local parts = self._parts
    self._buf = self._buf .. concat(parts, "", 1, n)
    for i = 1, n do parts[i] = nil end
    self._pn = 0
  end
  return self._buf
end

-- Add streamed text, appending the sentences it completed to `out` from
-- out[k + 1]; returns the new count. Incremental: a delta without a
-- terminator, a line break or a byte that may start "…" cannot complete a
-- sentence unless one is waiting for more text (`_wait`), so it is only
-- appended; and a scan resumes where the last one stopped (every terminator
-- before it was judged "not an end", a verdict later text cannot change).
function Splitter:_push(text, out, k)
  if not self._wait and not find(text, "[%.!%?\n\226]") then
    local n = self._pn + 1
    self._parts[n], self._pn = text, n
    return k
  end
  local n = self._pn + 1
  self._parts[n], self._pn = text, n
  local s, from, pos = self:_text(), 1, self._pos
  self._wait = false
  while true do
    local i = find(s, "[%.!%?\n\226]", pos)
    if not i then break end
    local j = run_end(s, i)
    local stop, next_from
    if sub(s, i, i) == "\n" then
      stop, next_from = i - 1, i + 1
    elseif j then
      stop, next_from = self:_decide(s, from, i, j)
      if stop == nil then self._wait = true; break end
    end
    if stop then
      local sentence = trim(sub(s, from, stop))
      if sentence ~= "" then
        k = k + 1; out[k] = sentence
        self._quote = quote_depth(self._quote, sentence)
      end
      from, pos = next_from, next_from
    else
      pos = (j or i) + 1
    end
  end
  if incomplete_tail(s) then -- a verdict may have read a cut character as something else
    self._wait, pos = true, from
  elseif not self._wait then
    pos = #s + 1
  end
  self._buf, self._pos = from == 1 and s or sub(s, from), pos - from + 1
  return k
end

---Add streamed text; returns the sentences it completed (maybe none).
---@param text string
---@return string[] sentences
function Splitter:push(text)
  local out = {}
  self:_push(text, out, 0)
  return out
end

---End of the stream: the rest, as a last sentence (an empty list if blank).
---@return string[] sentences
function Splitter:flush()
  local rest = trim(self:_text())
  self._buf, self._pos, self._wait, self._quote = "", 1, false, 0
  return rest ~= "" and { rest } or {}
end

---Split a whole text into sentences.
---@param text string
---@param opts? table as for `route.splitter`
---@return string[]
function M.split(text, opts)
  local sp = M.splitter(opts)
  local out = sp:push(text)
  for _, s in ipairs(sp:flush()) do out[#out + 1] = s end
  return out
end

-- A file handle as a sink: a write that fails (disk full, a closed pipe)
-- raises rather than losing the text silently.
local function file_sink(f, line)
  return function(text)
    local ok, err = f:write(text, line and "\n" or "")
    if not ok then error("route: cannot write to the sink: " .. tostring(err), 0) end
  end
end

-- Whether a userdata has a write method (indexing some userdata raises).
local function has_write(u)
  local ok, w = pcall(function() return u.write end)
  return ok and w ~= nil
end

---A sink as a function `(text, ev)`. A Lua function passes through (it
---gets the text and the event); a C function (`print`, `io.write`) gets the
---text only; a file handle is written with `f:write(text)` (and a line
---break when `line`: the error sink); an object with `write` is called
---`obj:write(text, ev)`; nil is a sink that drops everything.
---@param sink function|file*|{write: function}|nil
---@param line? boolean end each write to a file handle with a line break
---@return fun(text: string, ev: table?)
function M.sink(sink, line)
  if sink == nil then return function() end end
  local ty = type(sink)
  if ty == "function" then
    if debug.getinfo(sink, "S").what ~= "C" then return sink end
    return function(text) return sink(text) end
  end
  local io_ty = io.type(sink)
  if io_ty == "file" then return file_sink(sink, line) end
  if io_ty == "closed file" then error("route: the sink is a closed file: open it again, or pass another sink", 2) end
  if (ty == "table" and sink.write) or (ty == "userdata" and has_write(sink)) then
    return function(text, ev) return sink:write(text, ev) end
  end
  error(("route: a sink is a function, a file handle or an object with a write method, not a %s"):format(ty), 2)
end

---A sink that collects what it gets: `b.parts` (list), `b:text()`.
---@return {parts: string[], write: function, text: function}
function M.buffer()
  return {
    parts = {},
    write = function(self, text) self.parts[#self.parts + 1] = text end,
    text = function(self) return table.concat(self.parts) end,
  }
end

-- The default error sink: errors are never silent.
local function stderr_sink(message, ev)
  io.stderr:write(("mirza: %s error: %s\n"):format(ev and ev.code or "?", message))
end

-- A channel: delivers one stream of deltas to its sink in its mode, and
-- keeps the whole text for the result. It is a rope (mirza.result: the
-- fields parts, n, runs), so `join(ch)` is its whole text so far, one
-- string kept in place of its runs.
local function channel(sink, mode, splitter_opts)
  if mode ~= "token" and mode ~= "sentence" and mode ~= "whole" then
    error(("route: unknown mode %q (token, sentence, whole)"):format(tostring(mode)), 3)
  end
  local ch = result.rope()
  ch.sink, ch.mode, ch.open, ch.out = M.sink(sink), mode, false, {}
  ch.splitter = mode == "sentence" and M.splitter(splitter_opts) or nil
  return ch
end

-- One delta of the channel: kept, and delivered in the channel's mode.
local function channel_push(ch, text, ev)
  keep(ch, text)
  ch.open = true
  local mode = ch.mode
  if mode == "token" then
    ch.sink(text, ev)
  elseif mode == "sentence" then
    local out = ch.out
    local k = ch.splitter:_push(text, out, 0)
    for i = 1, k do
      local sentence = out[i]
      out[i] = nil
      ch.sink(sentence, ev)
    end
  end
end

-- The channel's stream is over: deliver what is held back, once.
local function channel_end(ch, ev)
  if not ch.open then return end
  ch.open = false
  if ch.mode == "sentence" then
    for _, s in ipairs(ch.splitter:flush()) do ch.sink(s, ev) end
  elseif ch.mode == "whole" then
    local text = join(ch)
    if text ~= "" then ch.sink(text, ev) end
  end
end

---@class mirza.RouteOptions
---@field answer? function|file*|table  sink of the answer channel (see `route.sink`)
---@field think? function|file*|table   sink of the think channel
---@field error? function|file*|table   sink of errors: (message, ev); default: stderr
---@field mode? "token"|"sentence"|"whole"  answer delivery (default "sentence")
---@field think_mode? "token"|"sentence"|"whole"  think delivery (default "token")
---@field on_event? fun(ev: table)  every other event (progress, heartbeat, tool_call, done, cut)
---@field flush_on_error? boolean  deliver the partial answer before an error (default true)
---@field abbreviations? table<string, boolean>  extra abbreviations for the splitter

---@class mirza.RouteResult
---@field answer string
---@field think string
---@field finish_reason? string
---@field usage? table
---@field stats? table
---@field timings? table
---@field error? table
---@field cut? table
---@field ended boolean

---@class mirza.Router
---@field result mirza.RouteResult
local Router = {}
Router.__index = Router

---A router for one turn: `r:feed(ev)` for each event, `r:finish()` at the
---end; `r.result` then holds the texts and the terminal event's figures.
---@param opts? mirza.RouteOptions
---@return mirza.Router
function M.router(opts)
  opts = opts or {}
  local sp = { abbreviations = opts.abbreviations }
  return setmetatable({
    opts = opts,
    answer = channel(opts.answer, opts.mode or "sentence", sp),
    think = channel(opts.think, opts.think_mode or "token", sp),
    error_sink = opts.error and M.sink(opts.error, true) or stderr_sink,
    on_event = opts.on_event,
    result = { answer = "", think = "", ended = false },
  }, Router)
end

-- A terminal event (or the end of the iterator): close both channels.
function Router:_close(ev, deliver)
  if self.result.ended then return end
  self.result.ended = true
  if deliver ~= false then
    channel_end(self.think, ev)
    channel_end(self.answer, ev)
  end
  self.result.answer = join(self.answer)
  self.result.think = join(self.think)
end

local handlers = {}

function handlers.think(r, ev) channel_push(r.think, ev.text, ev) end

function handlers.text(r, ev)
  channel_end(r.think, ev) -- the answer began: the thinking is over
  channel_push(r.answer, ev.text, ev)
end

function handlers.done(r, ev)
  local res = r.result
  res.finish_reason, res.usage, res.stats, res.timings = ev.finish_reason, ev.usage, ev.stats, ev.timings
  r:_close(ev)
end

function handlers.error(r, ev)
  r.result.error = ev
  r:_close(ev, r.opts.flush_on_error ~= false)
  r.error_sink(ev.message or "error", ev)
end

-- A cut: the repetition guard's delivers what is held back; a cancelled
-- turn (barge-in) delivers nothing more.
function handlers.cut(r, ev)
  r.result.cut = ev
  r:_close(ev, ev.reason ~= "cancelled")
end

---The text a channel has received so far ("answer" or "think"), whole.
---@param name "answer"|"think"
---@return string
function Router:text(name)
  return join(self[name])
end

---Route one event.
---@param ev table
function Router:feed(ev)
  if self.result.ended then return end
  local ty = ev.type
  if ty == "text" then -- the deltas first: one comparison each
    local think = self.think
    if think.open then channel_end(think, ev) end -- the answer began: the thinking is over
    channel_push(self.answer, ev.text, ev)
  elseif ty == "think" then
    channel_push(self.think, ev.text, ev)
  else
    local h = handlers[ty]
    if h then h(self, ev) end
    if ty ~= "error" and self.on_event then self.on_event(ev) end
  end
end

---The event iterator ended. Without a terminal event the stream was cut
---short: what was held back is still delivered.
---@return table result
function Router:finish()
  self:_close(nil)
  return self.result
end

---Routing as a pipeline stage: events pass through unchanged, and are
---delivered to the sinks on the way.
---@param upstream mirza.EventIter
---@param opts? mirza.RouteOptions
---@return mirza.EventIter
function M.stage(upstream, opts)
  local r = M.router(opts)
  return function()
    local ev = upstream()
    if ev == nil then r:finish() else r:feed(ev) end
    return ev
  end
end

---Drain an event iterator into the sinks; returns the turn's result.
---@param events mirza.EventIter
---@param opts? mirza.RouteOptions
---@return table result `{answer, think, finish_reason, usage, stats, timings, error, cut, ended}`
function M.run(events, opts)
  local r = M.router(opts)
  for ev in events do r:feed(ev) end
  return r:finish()
end

---The seed's inline rendering: one stream of strings, the thinking wrapped
---in `<think>` … `</think>`, then the answer. Errors go to `opts.error`
---(default: stderr), never into the stream.
---@param events mirza.EventIter
---@param opts? {error?: function|table}
---@return fun(): string|nil
function M.inline(events, opts)
  local error_sink = opts and opts.error and M.sink(opts.error, true) or stderr_sink
  local queue, thinking, ended = {}, false, false
  local function push(ev)
    if ev.type == "think" then
      if not thinking then queue[#queue + 1] = "<think>" end
      thinking = true
      queue[#queue + 1] = ev.text
      return
    end
    if thinking and (ev.type == "text" or ev.type == "done" or ev.type == "error" or ev.type == "cut") then
      thinking = false
      queue[#queue + 1] = "</think>"
    end
    if ev.type == "text" then queue[#queue + 1] = ev.text end
    if ev.type == "error" then error_sink(ev.message or "error", ev) end
  end
  return function()
    while #queue == 0 and not ended do
      local ev = events()
      if ev then push(ev) else ended = true; push({ type = "done" }) end
    end
    return table.remove(queue, 1)
  end
end

return M
