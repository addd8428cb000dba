--- chat.lua - an assistant loop over stdin lines (or a FIFO, or a file).
---
---   build/mirza scripts/chat.lua [behaviour.lua] [--sim] [--port N] [--fifo PATH] [--verbose]
---                                [--continue [NAME]] [--name NAME] [--no-save] [--help]
---   mirza chat ...          (the same, installed)
---
--- Each input line is one user turn; the thinking goes to stderr (a block
--- starting "thinking: ", dim on a terminal unless NO_COLOR is set, ended
--- by its own line end), the answer to stdout sentence by sentence, an
--- error on a line of its own, stats after each turn. Ctrl-C stops the
--- answer and ends the chat (status 130), the part heard saved. Commands:
---   /think on|off   toggle thinking        /budget N   reasoning budget (said back)
---   /clear          clear the session cache /new       fresh conversation and session
---   /reload         reload behaviour now   /stats      last turn's figures
---   /help           list the commands      /quit       leave
--- An unknown /command is reported, never sent as a prompt.
--- A behaviour file (a Lua module returning a table) is hot-reloaded when it
--- changes, between turns (mirza.behaviour): a broken edit keeps the
--- previous version; a hook or stage that raises at run time is reported
--- with file:line and the previous version (or the built-in default) runs
--- that turn. It may define: system (string; a change applies from the
--- next turn and is prefilled), stage (function(upstream) -> iterator, a
--- pipeline stage in every turn), on_turn(text, engine) -> text.
--- Engine settings come from the environment (MIRZA_BASE_URL, MIRZA_MODEL,
--- MIRZA_PRESET, ...) or ~/.config/mirza/config.lua; --sim runs against
--- mirza-sim (port 18767, or --port). Without a preset, what answers at the
--- URL (llama-server, Ollama, vLLM, MTPLX, any /v1/models) is used as it is
--- and named on the first line; --verbose (MIRZA_VERBOSE=1) adds the
--- engine's one line about it. At the end the chat stops a daemon it
--- started and leaves an adopted or detected one running.
--- The conversation is saved after every turn (mirza.conversation) in
--- $XDG_STATE_HOME/mirza/conversations (else ~/.local/state/mirza/
--- conversations, made 0700) as NAME.json, NAME the start's local time or
--- --name NAME, claimed when the chat starts (another chat started in the
--- same second takes NAME-2: conversation.claim); --continue resumes the last one saved (history, session,
--- thinking), --continue NAME a named one, else the file NAME of the
--- current directory (a file is saved back there; NAME.json or a NAME
--- holding a / is a file first; a NAME ending in .lua is the behaviour
--- file); /new starts another; --no-save keeps nothing. The run log
--- (MIRZA_RECORD) names it. --help lists the options; a bad one exits 2.
local engine = require "mirza.engine"
local behaviour_mod = require "mirza.behaviour"
local conversation = require "mirza.conversation"

local USAGE = [[
usage: mirza chat [behaviour.lua] [options]   (or: mirza scripts/chat.lua ...)
Each line of stdin is a user turn; in the chat, /help lists the commands.
  behaviour.lua      a module returning {system, stage, on_turn}, hot-reloaded
  --sim              run against mirza-sim, started on port 18767 (or --port)
  --port N           the daemon's port (with --sim, the simulator's)
  --fifo PATH        read the turns from PATH (a FIFO or a file), not stdin
  -v, --verbose      add the engine's line about the daemon (MIRZA_VERBOSE=1)
  --continue [NAME]  resume the last conversation, or NAME (a name or a file)
  --name NAME        name the new conversation (default: the local time)
  --no-save          save nothing
  -h, --help         print this help and exit
Engine settings: MIRZA_BASE_URL, MIRZA_MODEL, ... (mirza --help).
Exit status: 0 done, 1 a daemon, behaviour or conversation failed, 2 bad usage.
]]

local function usage_error(msg)
  io.stderr:write("chat: ", msg, " (mirza chat --help lists the options)\n")
  os.exit(2)
end

local behaviour_path, use_sim, fifo, port, verbose, continue, name, no_save
local i = 1
-- The value of option arg[i]: the next argument, which must be there and
-- not be an option.
local function value(what)
  local v = arg[i + 1]
  if v == nil or (v:find("^%-.") and not tonumber(v)) then usage_error(arg[i] .. " needs " .. what) end
  i = i + 1
  return v
end
while arg[i] do
  local a = arg[i]
  if a == "--help" or a == "-h" then io.write(USAGE) os.exit(0)
  elseif a == "--sim" then use_sim = true
  elseif a == "--verbose" or a == "-v" then verbose = true
  elseif a == "--fifo" then fifo = value("a path")
  elseif a == "--port" then
    local v = value("a port number")
    port = tonumber(v)
    if math.type(port) ~= "integer" or port < 1 or port > 65535 then
      usage_error("--port needs a port number from 1 to 65535, not " .. v)
    end
  elseif a == "--name" then name = value("a conversation name")
  elseif a == "--no-save" then no_save = true
  elseif a == "--continue" then
    continue = true
    local nxt = arg[i + 1]
    if nxt and not nxt:find("^%-") and not nxt:find("%.lua$") then i = i + 1; continue = nxt end
  elseif a:find("^%-.") then usage_error("unknown option " .. a)
  elseif behaviour_path then usage_error(("one behaviour file only, not %s and %s"):format(behaviour_path, a))
  else behaviour_path = a end
  i = i + 1
end

local function say_err(...) io.stderr:write(...) io.stderr:write("\n") end

-- Where the conversation is kept: the directory (nil: not saved) and the
-- file to resume (--continue).
local conv_dir, resume, own_file -- own_file: --continue PATH, saved back there
-- claim: the new conversation's name, held until its first save (mirza.conversation.claim);
-- released too when the chunk ends by an error (Ctrl-C)
local claim
local _ <close> = setmetatable({}, { __close = function() if claim then claim:release() end end })
if not no_save or continue then
  local err
  conv_dir, err = conversation.dir()
  if not conv_dir and not no_save then say_err("chat: the conversation will not be saved: ", err) end
end
if name and not conversation.valid_name(name) then
  say_err("chat: ", ("%q is not a conversation name (letters, digits, . _ -)"):format(name))
  os.exit(2)
end
if continue then
  local found, why, kind = conversation.find(conv_dir, continue ~= true and continue or nil)
  if not found then
    say_err("chat: ", why)
    os.exit(1)
  end
  resume, name = found, name or why
  if kind == "file" then own_file = found end
elseif conv_dir then -- a new conversation: its name claimed now, not at its first save
  local why, code
  if name then claim, why, code = conversation.claim(conv_dir, name)
  else claim, why, code = conversation.claim_new(conv_dir) end
  if code == "taken" then
    say_err("chat: ", why)
    os.exit(2)
  end
  if not claim then
    say_err("chat: the conversation will not be saved: ", why)
    conv_dir = nil
  end
  name = claim and claim.name or name
end

-- Leave with status code, giving up a name nothing was saved under.
local function leave(code)
  if claim then claim:release() end
  os.exit(code)
end

local b = behaviour_mod.default()
if behaviour_path then
  local err
  b, err = behaviour_mod.new("chat_behaviour", behaviour_path, function(m) say_err("behaviour error: ", m) end)
  if not b then
    say_err("chat: ", err)
    leave(1)
  end
end

local opts = use_sim and { preset = "mirza-sim", port = port or 18767, daemon = { args = { "--tok-rate", "60" } } }
    or (port and { port = port }) or {}
opts.verbose = verbose
opts.history = resume
local made, e, new_err = pcall(engine.new, opts) -- a broken config file: its message, no traceback
if not made and require("mirza.pipeline").passes(e) then error(e, 0) end -- Ctrl-C: on up to the host (status 130)
if not made or not e then
  say_err("chat: ", tostring(made and new_err or e))
  leave(1)
end
e.conversation_name = name
e.stages = { b:stage_spec() }
local ok, msg = e:load(b:system())
if not ok then
  say_err("chat: ", msg)
  leave(1)
end
local how = e.detected and ("using " .. require("mirza.detect").describe(e.detected) .. " at")
    or not e.daemon and "using" or e.daemon.adopted and "adopted" or "started"
say_err(("chat: %s %s (session %s%s). /help for commands, /quit to leave."):format(how,
  require("mirza").redact_url(e.base_url), e.cfg.session_id, name and (", conversation " .. name) or ""))
if e.conversation then
  local c = e.conversation
  say_err(("chat: continuing %s: %d messages, saved %s%s"):format(name, c.messages, tostring(c.saved_at),
    c.model and c.model ~= e:model() and (", answered by " .. c.model .. " then") or ""))
end

-- After every turn: the conversation saved as NAME.json, NAME the last one
-- (a failure said once, the chat goes on).
local save_failed
local function save()
  if no_save or not (own_file or conv_dir) or not name or #e.history.messages == 0 then return end
  local saved, err = e:save(own_file or conversation.path(conv_dir, name))
  if saved and claim then -- the file holds the name from now on
    claim:release()
    claim = nil
  end
  if saved and not own_file then saved, err = conversation.mark_last(conv_dir, name) end
  if not saved and not save_failed then say_err("chat: the conversation is not saved: ", err) end
  save_failed = not saved
end

local function show_stats(st)
  if not st then return end
  say_err(("[ttft %.0f ms, %.1f tok/s, %d tokens, kv %d%s%s]"):format(st.ttft_ms, st.tok_s, st.tokens,
    st.kv_tokens, st.cached_tokens and (", cached " .. st.cached_tokens) or "",
    st.session_cache_hit == false and (", cache miss: " .. tostring(st.cache_miss_reason)) or ""))
end

-- Between turns: a reloaded behaviour is taken up; a changed system
-- prompt applies from this turn on (and is prefilled).
local function refresh()
  e:reload()
  b:refresh()
  local sys = b:system()
  if sys ~= e.system_prompt and sys then e:load(sys) end
end

local commands
commands = {
  think = function(a) e:set_thinking(a ~= "off") say_err("thinking ", a ~= "off" and "on" or "off") end,
  budget = function(a)
    local n = math.tointeger(tonumber(a))
    if not n or n < 0 then
      return say_err("error: /budget takes a number of tokens (0: thinking off), not '", a, "'")
    end
    e:set_reasoning_budget(n)
    say_err(n > 0 and ("reasoning budget %d tokens (thinking on)"):format(n) or "reasoning budget 0 (thinking off)")
  end,
  clear = function()
    local done, why = e:clear_cache()
    say_err(done and "session cache cleared" or ("cache not cleared: " .. tostring(why)))
  end,
  new = function()
    e:reset()
    own_file = nil
    if conv_dir and not no_save then
      if claim then claim:release() end -- nothing saved under the old name
      local why
      claim, why = conversation.claim_new(conv_dir)
      if not claim then say_err("chat: the conversation will not be saved: ", why) end
      name = claim and claim.name
      e.conversation_name = name
    end
    say_err("new conversation (session ", e.cfg.session_id, ")", name and (", saved as " .. name) or "")
  end,
  reload = function()
    local done, failed = e:reload()
    for _, n in ipairs(done) do say_err("reloaded ", n) end
    for n in pairs(failed) do say_err("kept old ", n) end
  end,
  stats = function() show_stats(e.last) end,
  help = function()
    local names = {}
    for n in pairs(commands) do names[#names + 1] = "/" .. n end
    table.sort(names)
    say_err("commands: ", table.concat(names, " "), " /quit")
  end,
}

-- The thinking, set apart from the answer: a block on stderr that starts
-- with "thinking: " and ends with its own line end before anything else
-- is printed (the answer, an error, the stats); dim on a terminal (unless
-- NO_COLOR is set).
local dim, undim = "", ""
if require("mirza").isatty(2) and (os.getenv("NO_COLOR") or "") == "" then dim, undim = "\27[2m", "\27[0m" end
local thinking = false -- a thinking block is open on stderr
local function think(t)
  io.stderr:write(dim, thinking and "" or "thinking: ", t, undim)
  thinking = true
end
local function end_thinking()
  if thinking then io.stderr:write("\n") thinking = false end
end

-- One turn. Ctrl-C stops the answer and ends the chat (status 130): what
-- was heard is kept in the conversation, saved first.
local function turn(line)
  refresh()
  local text = b:on_turn(line, e)
  local ran, st, res, _, routed = pcall(e.say, e, text, {
    mode = "sentence",
    think = think,
    answer = function(s)
      end_thinking()
      io.write(s, "\n")
      io.flush()
    end,
    error = function(m) end_thinking() say_err("error: ", m) end, -- on its own line
  })
  end_thinking()
  if not ran then
    save()
    error(st, 0)
  end
  if st then show_stats(st)
  elseif not routed then say_err("turn failed: ", tostring(res)) end -- else the error sink said it
  save()
end

-- The input lines: on a terminal, with line editing and history where
-- the `mirza` host has readline (mirza.readline); else read as they come.
local function input_lines()
  local mirza = require "mirza"
  if not fifo and mirza.isatty(0) and mirza.isatty(1) then
    local has, rl = pcall(require, "mirza.readline")
    if has then return function() return rl.read("> ") end end
  end
  return (fifo and assert(io.open(fifo)) or io.stdin):lines()
end

for line in input_lines() do
  local cmd, a = line:match("^/(%S+)%s*(.-)%s*$")
  if cmd == "quit" then break end
  if cmd then
    if commands[cmd] then
      commands[cmd](a)
      if cmd == "think" or cmd == "budget" then save() end -- the thinking state is part of it
    else say_err("error: unknown command /", cmd, " (/help lists them)") end
  elseif line:find("%S") then
    turn(line)
  end
end
e:close() -- stops a daemon we started; an adopted one stays
if claim then claim:release() end -- nothing was saved under the name
