--- mirza.thinktags: reasoning sent as `<think>…</think>` inside `content`.
---
--- llama-server without a reasoning parser, vLLM without
--- `--reasoning-parser`, older Ollama and most proxies send the model's
--- reasoning inline in the answer. This stage splits it back out: text
--- between the tags becomes `think` events, the tags disappear, the rest
--- stays `text`. It works across any chunk boundary (`<th` + `ink>`): a
--- possible tag cut at the end of a delta is held back (at most 8 bytes)
--- until the next delta tells.
---
--- Modes (`opts.mode`, the engine's `think_tags` option):
---   false    off: content passes through untouched.
---   true     split tags anywhere; the stream starts outside a think.
---   "open"   the stream starts inside an open `<think>` (chat templates
---            that open it in the prompt): everything up to `</think>` is
---            reasoning.
---   "auto"   (default) like true, and when the turn asked for thinking
---            (`opts.hold`), text before the first tag is held back: a
---            `</think>` first means it was reasoning (template-opened
---            think), a `<think>` first or the end of the stream means it
---            was answer. The hold ends at once when the server sends
---            reasoning fields itself (a `think` event upstream), so servers
---            that parse reasoning stream as before. Cost of the rule: a
---            thinking turn against a server that sends neither reasoning
---            fields nor tags delivers its answer at the end.
--- A `</think>` outside a think (when not holding) is dropped: the text
--- before it has already gone out as answer. Leading white space of the
--- answer right after `</think>` is dropped (templates put "\n\n" there).
---
--- Cost: a delta without `<` and nothing held back is passed through as
--- is after one flag test and one plain `string.find`; inside a think the event is retyped
--- in place. Only deltas around a tag allocate.
local M = {}

local find, sub = string.find, string.sub
local OPEN, CLOSE = "<think>", "</think>"

-- The first tag at or after `init`: i, j, kind ("open"/"close"); or nil
-- and the start of a possible tag cut at the end of s (nil when none).
local function next_tag(s, init)
  local n = #s
  while true do
    local i = find(s, "<", init, true)
    if not i then return nil, nil end
    if sub(s, i, i + 6) == OPEN then return i, i + 6, "open" end
    if sub(s, i, i + 7) == CLOSE then return i, i + 7, "close" end
    local rest = n - i + 1
    if rest < 8 and (sub(OPEN, 1, rest) == sub(s, i) or sub(CLOSE, 1, rest) == sub(s, i)) then
      return nil, i
    end
    init = i + 1
  end
end

---@class mirza.ThinkTagsOptions
---@field mode? boolean|"auto"|"open"  default "auto"
---@field hold? boolean  auto: this turn asked for thinking (see the module comment)

---The splitter as a pipeline stage (`pipeline.compose`, or around any
---event iterator such as `s:events()` of a raw stream).
---@param upstream mirza.EventIter
---@param opts? mirza.ThinkTagsOptions
---@return mirza.EventIter
function M.stage(upstream, opts)
  local mode = "auto"
  if opts and opts.mode ~= nil then mode = opts.mode end
  if mode == false then return upstream end
  if mode ~= true and mode ~= "auto" and mode ~= "open" then
    error(("thinktags: unknown mode %q (true, false, \"auto\", \"open\")"):format(tostring(mode)), 2)
  end
  local inside = mode == "open"
  local hold = mode == "auto" and opts ~= nil and opts.hold == true
  local pending = ""          -- a possible tag cut at the end of the last delta
  local held = {}             -- hold: text before the first tag
  local trim = false          -- drop leading space of the answer after </think>
  local queue, qh, qt = {}, 1, 0
  local quiet = not hold      -- nothing pending, held or trimmed: a delta without "<" passes as is

  local function requiet()
    quiet = pending == "" and not hold and not trim
  end

  local function push(ty, text)
    if ty == "text" and trim then
      text = text:gsub("^%s+", "")
      if text == "" then return end
      trim = false
    end
    if text == "" then return end
    qt = qt + 1
    queue[qt] = { type = ty, text = text }
  end

  local function emit(text)
    if text == "" then return end
    if hold then held[#held + 1] = text
    else push(inside and "think" or "text", text) end
  end

  -- The hold is over: the held text was `as` ("think" or "text").
  local function release(as)
    if not hold then return end
    hold = false
    push(as, table.concat(held))
    held = {}
    requiet()
  end

  local function tag(kind)
    if kind == "open" then
      release("text")
      inside = true
    else
      release("think")
      trim = true
      inside = false
    end
  end

  local function scan(s)
    local pos = 1
    while true do
      local i, j, kind = next_tag(s, pos)
      if not i then
        emit(sub(s, pos, j and j - 1 or #s))
        pending = j and sub(s, j) or ""
        return
      end
      emit(sub(s, pos, i - 1))
      tag(kind)
      pos = j + 1
    end
  end

  local function scan_all(s)
    scan(s)
    requiet()
  end

  -- End of the stream (or a terminal event): a held-back partial tag was
  -- text after all; held text was answer.
  local function flush()
    local p = pending
    pending = ""
    emit(p)
    release("text")
    requiet()
  end

  local function pop()
    local ev = queue[qh]
    queue[qh] = nil
    qh = qh + 1
    if qh > qt then qh, qt = 1, 0 end
    return ev
  end

  return function()
    if qh <= qt then return pop() end
    while true do
      local ev = upstream()
      if ev == nil then
        flush()
        if qh <= qt then return pop() end
        return nil
      end
      local ty = ev.type
      if ty == "text" then
        local t = ev.text
        if quiet and not find(t, "<", 1, true) then
          if inside then ev.type = "think" end
          return ev
        end
        scan_all(pending .. t)
        if qh <= qt then return pop() end
      elseif ty == "think" then
        if hold then release("text") end -- the server parses reasoning itself
        if qh <= qt then
          qt = qt + 1
          queue[qt] = ev
          return pop()
        end
        return ev
      else
        if ty == "done" or ty == "error" or ty == "cut" then flush() end
        if qh <= qt then
          qt = qt + 1
          queue[qt] = ev
          return pop()
        end
        return ev
      end
    end
  end
end

---Split a whole string (tests, replays): a list of `{type, text}` events.
---@param text string
---@param opts? mirza.ThinkTagsOptions
---@return table[]
function M.split(text, opts)
  local done = false
  local it = M.stage(function()
    if done then return nil end
    done = true
    return { type = "text", text = text }
  end, opts)
  local out = {}
  for ev in it do out[#out + 1] = ev end
  return out
end

return M
