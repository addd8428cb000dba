--- bench.lua - CPU cost per streamed token through the Lua loop.
---
---   mirza bench [tokens] [sim-binary]     (build/mirza scripts/bench.lua from the tree)
---
--- Starts mirza-sim "as fast as possible" (--tok-rate 0), streams `tokens`
--- answer tokens through `for ev in s:events()` and prints the CPU time of
--- this process (os.clock: user+system, the simulator excluded) per token.
--- The target is at most ~0.65 us/token.
local mirza = require "mirza"

local N = tonumber(arg[1]) or 200000
local sim_bin = arg[2] or require("mirza.daemon").find_sim() -- $MIRZA_SIM, next to mirza, build/, PATH

local port_file = os.tmpname()
local p = assert(io.popen(("%q --port 0 --port-file %q --tok-rate 0 --ttft-ms 0 --progress-every 0"
  .. " --context-window 100000000 >/dev/null 2>&1 & echo $!"):format(sim_bin, port_file)))
local pid = p:read("l")
p:close()
local port
for _ = 1, 500 do
  local f = io.open(port_file)
  port = f and tonumber(f:read("a"))
  if f then f:close() end
  if port then break end
  mirza.sleep(0.01)
end
os.remove(port_file)
assert(port, "mirza-sim did not start")

local function run(n)
  local s <close> = mirza.open {
    url = ("http://127.0.0.1:%d/v1/chat/completions"):format(port),
    body = { stream = true, messages = { { role = "user", content = "bench" } }, max_tokens = n + 10,
             mirza_sim = { answer_tokens = n } },
  }
  local count, bytes = 0, 0
  local c0, t0 = os.clock(), mirza.now()
  for ev in s:events() do
    if ev.type == "text" then
      count = count + 1
      bytes = bytes + #ev.text
    elseif ev.type == "error" then
      error(ev.message)
    end
  end
  return count, bytes, os.clock() - c0, mirza.now() - t0
end

run(2000) -- warm up: connection, buffers
local best
for _ = 1, 3 do
  local count, bytes, cpu, wall = run(N)
  assert(count == N, ("expected %d tokens, got %d"):format(N, count))
  if not best or cpu < best.cpu then best = { count = count, bytes = bytes, cpu = cpu, wall = wall } end
end
os.execute("kill " .. pid)
print(("tokens        %d (%d bytes of text)"):format(best.count, best.bytes))
print(("cpu           %.3f s (mirza process: curl + SSE + JSON + Lua loop)"):format(best.cpu))
print(("wall          %.3f s"):format(best.wall))
print(("cpu per token %.3f us   (target <= 0.65 us)"):format(best.cpu / best.count * 1e6))
print(("tokens/s      %.0f"):format(best.count / best.wall))
