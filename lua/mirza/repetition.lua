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
--- The rules run in C (src/guard.c: the same verdicts as the Lua guard
--- they replaced, tests/lua/repetition_ref.lua, at a tenth of its cost per
--- token); this module is the policy over them: the thresholds, which
--- channels are watched, and what a cut does. `repetition.new(opts)` is
--- the plain guard object (`guard:feed(chunk)`); `repetition.stage` wraps
--- one guard per watched channel over an event iterator. The module holds
--- no state. A policy file that replaces it may bring its own rules: the
--- stage is all the engine uses.

local core = require "mirza.core"

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
  max_phrase = 64,         -- phrase rule: longest unit, in bytes (at most 4096)
  phrase_min_letters = 4,  -- phrase rule: letters the unit needs
  line_repeats = 32,       -- phrase rule, unit with a line break: repetitions
}

-- The thresholds a guard made from opts uses: each field of DEFAULTS,
-- opts' own where it has one (other keys left out).
local function thresholds_of(opts)
  local t = {}
  for k, v in pairs(M.DEFAULTS) do t[k] = (opts and opts[k]) or v end
  return t
end

---A new guard. `opts` overrides fields of `repetition.DEFAULTS` (other
---keys are ignored); a threshold that is not a number from 0 to 1e6
---(`max_phrase`: to 4096) raises.
---@param opts? table
---@return mirza.RepetitionGuard
function M.new(opts)
  return core.guard(thresholds_of(opts))
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
  local thresholds -- filled once, for the first guard: the others share it
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
          thresholds = thresholds or thresholds_of(opts)
          g = core.guard(thresholds)
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
