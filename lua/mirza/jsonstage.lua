--- mirza.jsonstage: `json` events as the values of a JSON answer complete.
---
--- A pipeline stage (mirza.pipeline) for a turn whose answer is JSON: every
--- event passes through unchanged and in order, and the answer's text
--- deltas (`type = "text"`; `think` events are not fed) go through an
--- incremental parser in C (`mirza.json.stream`), so that each value
--- completed at `opts.depth` is added right after the delta that completed
--- it, as `{type = "json", path = "/items/3", value = {...}}`. A script acts
--- on the first record while the rest is still being generated.
---
--- Text before the first `{` or `[` is skipped (a preamble; put the stage
--- after thinktags so `<think>` is already split off), text after the
--- top-level value is ignored. With `opts.root` ("object" or "array": the
--- schema's root type, `mirza.schema.root`) only that bracket starts the
--- value: `See [1] for the list: {...}` starts at the `{`. A start whose
--- text is not JSON before any value inside it completed (prose:
--- `{braces}`, `[see below]`) is given up for the next bracket at or after
--- the byte that broke it, up to 8 starts (`opts.candidates`), as
--- `mirza.schema.decode` does: the json events are those of the value the
--- decoded answer is. At the stream's terminal event (`done`,
--- `error` or `cut`) the parser is finished: when the JSON was cut, invalid
--- or absent, that event is passed on as it is with `json_error` set to the
--- message (the `json` events already given stand); a whole value leaves
--- it untouched. Invalid JSON met mid-stream stops the parsing: no more
--- `json` events, and the message goes to the terminal event.
---
--- Cost: one C call per text delta, no table unless it completes values;
--- no per-byte Lua.
local M = {}

local json = require("mirza.core").json

---@class mirza.JSONStageOptions
---@field depth? integer which values to hand out: 0 (default) the whole value, 1 its members or elements, ...
---@field max_bytes? integer cap on one value at that depth (mirza.json.stream)
---@field root? "object"|"array" the top-level value's type (default: either)
---@field candidates? integer starts tried (default 8: mirza.schema.CANDIDATES)

local TERMINAL = { done = true, error = true, cut = true }

---The stage (`pipeline.compose`, or around any event iterator).
---@param upstream mirza.EventIter
---@param opts? mirza.JSONStageOptions
---@return mirza.EventIter
function M.stage(upstream, opts)
  opts = opts or {}
  local p = json.stream { depth = opts.depth or 0, max_bytes = opts.max_bytes, root = opts.root,
    candidates = opts.candidates or require("mirza.schema").CANDIDATES }
  local failed -- the message of invalid JSON met mid-stream
  local ended = false -- the parser is finished and closed
  local queue, qh, qt = {}, 1, 0
  local got = {} -- feed appends here (no table per delta); emptied into the queue

  local function add(evs)
    for i = 1, #evs do
      qt = qt + 1
      queue[qt] = evs[i]
      evs[i] = nil
    end
  end

  -- The end: finish the parser once, and say why the JSON is not whole.
  local function finish(ev)
    if ended then return end
    ended = true
    local ok, msg = p:finish()
    p:close()
    if ev and not ok then ev.json_error = failed or msg end
  end

  return function()
    if qh <= qt then
      local ev = queue[qh]
      queue[qh] = nil
      qh = qh + 1
      if qh > qt then qh, qt = 1, 0 end
      return ev
    end
    local ev = upstream()
    if ev == nil then
      finish(nil)
      return nil
    end
    local ty = ev.type
    if ty == "text" and not failed and not ended then
      local evs, msg, _, done = p:feed(ev.text, got)
      if evs then
        if evs[1] then add(evs) end
      else
        failed = msg
        add(done)
      end
    elseif TERMINAL[ty] then
      finish(ev)
    end
    return ev
  end
end

return M
