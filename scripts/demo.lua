--- demo.lua - the engine end to end against the simulator daemon.
---
---   build/mirza scripts/demo.lua [preset]
---
--- The supervisor starts mirza-sim (or adopts one already on the port),
--- the system prompt is prefilled, then a few turns stream: thinking goes
--- to stderr (dimmed on a terminal), the answer is printed sentence by
--- sentence as a speech engine would receive it, stats follow each turn.
local engine = require "mirza.engine"

local tty = os.getenv("TERM") and require("mirza").isatty(1)
local dim, reset = tty and "\27[2m" or "", tty and "\27[0m" or ""

local e = engine.new {
  preset = "mirza-sim", port = tonumber(os.getenv("MIRZA_DEMO_PORT")) or 18766,
  daemon = { args = { "--tok-rate", "120", "--ttft-ms", "150" } },
  max_tokens = 200, max_tokens_thinking = 400,
}
local ok, msg = e:load("Tu es Mirza, un assistant vocal concis. Réponds en une ou deux phrases.")
if not ok then
  io.stderr:write("demo: ", msg, "\n")
  os.exit(1)
end
print(("daemon %s on %s, session %s"):format(e.daemon.adopted and "adopted" or "started", e.base_url, e.cfg.session_id))

local function stats_line(st)
  local parts = { ("ttft %.0f ms"):format(st.ttft_ms), ("%.1f tok/s"):format(st.tok_s), ("%d tokens"):format(st.tokens),
    ("kv %d"):format(st.kv_tokens) }
  if st.cached_tokens then parts[#parts + 1] = ("cached %d"):format(st.cached_tokens) end
  if st.mtp_acceptance then parts[#parts + 1] = ("MTP acceptance %.0f%%"):format(st.mtp_acceptance * 100) end
  return "[" .. table.concat(parts, ", ") .. "]"
end

local turns = {
  { "Bonjour ! Quel temps fait-il à Lyon aujourd'hui ?", true },
  { "Why is the sky blue? Explain briefly.", true },
  { "Merci, et demain ?", false },
}
for i, t in ipairs(turns) do
  e:set_thinking(t[2])
  print(("\n> %s  (thinking %s)"):format(t[1], t[2] and "on" or "off"))
  local thinking_open = false
  local st, err = e:say(t[1], {
    mode = "sentence",
    think = function(text)
      thinking_open = true
      io.stderr:write(dim, text, reset)
    end,
    answer = function(sentence)
      if thinking_open then io.stderr:write("\n") thinking_open = false end
      io.write("  « ", sentence, " »\n")
      io.flush()
    end,
    error = function(text) io.stderr:write("error: ", text, "\n") end,
  })
  if st then print(stats_line(st)) else print("turn failed: " .. tostring(err)) end
  if i == 2 then print(e:clear_cache() and "(cache cleared)" or "(cache clear skipped)") end
end
e:unload()
print("\ndaemon stopped")
