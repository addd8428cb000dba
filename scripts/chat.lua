--- chat.lua - an assistant loop over stdin lines (or a FIFO).
---
---   build/mirza scripts/chat.lua [behaviour.lua] [--sim] [--fifo PATH]
---
--- Each input line is one user turn; the thinking goes to stderr, the
--- answer to stdout sentence by sentence, stats after each turn. Commands:
---   /think on|off   toggle thinking        /budget N   reasoning budget
---   /clear          clear the daemon cache /reload     reload behaviour now
---   /stats          last turn's figures    /quit       leave
--- A behaviour file (a Lua module returning a table) is hot-reloaded when it
--- changes, between turns; a broken edit keeps the previous version. It may
--- define: system (string), stage (function(upstream) -> iterator, a
--- pipeline stage inserted in every turn), on_turn(text, engine) -> text.
--- Engine settings come from the environment (MIRZA_BASE_URL, MIRZA_MODEL,
--- MIRZA_PRESET, ...) or ~/.config/mirza/config.lua; --sim runs against
--- mirza-sim.
local mirza = require "mirza"
local engine = require "mirza.engine"

local behaviour_path, use_sim, fifo
local i = 1
while arg[i] do
  if arg[i] == "--sim" then use_sim = true
  elseif arg[i] == "--fifo" then i = i + 1; fifo = arg[i]
  else behaviour_path = arg[i] end
  i = i + 1
end

local BEHAVIOUR = "chat_behaviour"
local function behaviour() return package.loaded[BEHAVIOUR] or {} end
if behaviour_path then
  local mod, err = require("mirza.reload").load(BEHAVIOUR, behaviour_path)
  if not mod then
    io.stderr:write("chat: ", err, "\n")
    os.exit(1)
  end
  package.loaded[BEHAVIOUR] = mod
  mirza.watch(BEHAVIOUR, behaviour_path)
end

local e = engine.new(use_sim and { preset = "mirza-sim", port = 18767, daemon = { args = { "--tok-rate", "60" } } } or {})
e.stages = { { name = "behaviour", fn = function(up)
  local st = behaviour().stage
  return st and st(up) or up
end } }
local ok, msg = e:load(behaviour().system)
if not ok then
  io.stderr:write("chat: ", msg, "\n")
  os.exit(1)
end
io.stderr:write(("chat: %s on %s (session %s). /quit to leave.\n"):format(
  e.daemon.adopted and "adopted" or "started", e.base_url, e.cfg.session_id))

local function show_stats(st)
  if not st then return end
  io.stderr:write(("[ttft %.0f ms, %.1f tok/s, %d tokens, kv %d%s]\n"):format(st.ttft_ms, st.tok_s, st.tokens,
    st.kv_tokens, st.cached_tokens and (", cached " .. st.cached_tokens) or ""))
end

local commands = {
  think = function(a) e:set_thinking(a ~= "off") io.stderr:write("thinking ", a ~= "off" and "on" or "off", "\n") end,
  budget = function(a) e:set_reasoning_budget(tonumber(a) or 0) end,
  clear = function() io.stderr:write(e:clear_cache() and "cache cleared\n" or "cache clear skipped\n") end,
  reload = function()
    local done, failed = e:reload()
    for _, n in ipairs(done) do io.stderr:write("reloaded ", n, "\n") end
    for n in pairs(failed) do io.stderr:write("kept old ", n, "\n") end
  end,
  stats = function() show_stats(e.last) end,
}

local dim, undim = "", ""
if os.execute("test -t 2") == true then dim, undim = "\27[2m", "\27[0m" end

local input = fifo and assert(io.open(fifo)) or io.stdin
for line in input:lines() do
  local cmd, a = line:match("^/(%a+)%s*(.-)%s*$")
  if cmd == "quit" then break end
  if cmd and commands[cmd] then
    commands[cmd](a)
  elseif line:find("%S") then
    local hook = behaviour().on_turn
    local text = hook and hook(line, e) or line
    local thinking = false
    local st, res = e:say(text, {
      mode = "sentence",
      think = function(t) thinking = true io.stderr:write(dim, t, undim) end,
      answer = function(s)
        if thinking then io.stderr:write("\n") thinking = false end
        io.write(s, "\n")
        io.flush()
      end,
      error = function(m) io.stderr:write("error: ", m, "\n") end,
    })
    if st then show_stats(st) else io.stderr:write("turn failed: ", tostring(res), "\n") end
  end
end
e:unload()
