--- Shared helpers for the busted specs: paths, fixtures, and starting a
--- real mirza-sim process on a free loopback port.
local H = {}

H.source = os.getenv("MIRZA_SOURCE_DIR") or "."
H.build = os.getenv("MIRZA_BUILD_DIR") or (H.source .. "/build")
H.sim_bin = os.getenv("MIRZA_SIM")
if not H.sim_bin or H.sim_bin == "" then H.sim_bin = H.build .. "/mirza-sim" end
H.mirza_bin = os.getenv("MIRZA_BIN") or (H.build .. "/mirza")
H.fixtures = os.getenv("MIRZA_FIXTURES") or (H.source .. "/tests/fixtures")
H.traces = H.fixtures .. "/traces"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
H.q = shell_quote

function H.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

function H.tmpname(suffix)
  local n = os.tmpname()
  os.remove(n)
  return n .. (suffix or "")
end

local mirza = require "mirza"

--- Start mirza-sim with extra arguments; returns {url, base, port, pid, log, stop}.
---@param args? string[]
function H.start_sim(args)
  local port_file, log = H.tmpname(".port"), H.tmpname(".log")
  local argv = { shell_quote(H.sim_bin), "--port", "0", "--port-file", shell_quote(port_file) }
  for _, a in ipairs(args or {}) do argv[#argv + 1] = shell_quote(a) end
  local cmd = table.concat(argv, " ") .. " >" .. shell_quote(log) .. " 2>&1 & echo $!"
  local p = assert(io.popen(cmd))
  local pid = tonumber(p:read("l"))
  p:close()
  local port
  local t0 = mirza.now()
  while not port and mirza.now() - t0 < 10 do
    local f = io.open(port_file)
    if f then
      port = tonumber(f:read("a"))
      f:close()
    end
    if not port then mirza.sleep(0.01) end
  end
  os.remove(port_file)
  assert(port, "mirza-sim did not start: " .. (io.open(log) and H.read_file(log) or "?"))
  local sim = { port = port, pid = pid, log = log }
  sim.base = ("http://127.0.0.1:%d"):format(port)
  sim.url = sim.base .. "/v1/chat/completions"
  function sim.stop()
    if sim.pid then
      os.execute("kill " .. sim.pid .. " 2>/dev/null; wait " .. sim.pid .. " 2>/dev/null")
      sim.pid = nil
    end
    os.remove(log)
  end
  return sim
end

--- A chat request body.
function H.chat_body(prompt, extra)
  local body = { model = "mirza-sim", stream = true, messages = { { role = "user", content = prompt } } }
  for k, v in pairs(extra or {}) do body[k] = v end
  return body
end

--- Collect every event of a stream into {events, text, think, last}.
function H.drain(s, timeout)
  local r = { events = {}, text = {}, think = {} }
  while true do
    local ev, msg = s:next(timeout)
    if not ev then
      assert(msg == nil, msg)
      break
    end
    r.events[#r.events + 1] = ev
    if ev.type == "text" then r.text[#r.text + 1] = ev.text end
    if ev.type == "think" then r.think[#r.think + 1] = ev.text end
    r.last = ev
  end
  r.text, r.think = table.concat(r.text), table.concat(r.think)
  return r
end

return H
