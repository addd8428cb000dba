--- mirza.presets: the command lines (and environment) that start each
--- kind of daemon, built from the seed's settings — mtplx, llama-server,
--- ollama, vllm, mirza-sim, custom — and what differs by preset when not
--- given. Pure functions of the resolved options (mirza.daemon.resolve);
--- `mirza.daemon.presets` is this module's `argv` table.

local P = {}

local function argerror(fmt, ...)
  error("mirza.daemon: " .. fmt:format(...), 3)
end

-- What differs by preset when not given: the daemon's usual port, its
-- readiness route.
P.defaults = {
  ollama = { port = 11434, health = "/api/version" },
  vllm = { port = 8000 },
}

-- Presets that cannot start a daemon without `model` (they can adopt one).
P.needs_model = { mtplx = true, ["llama-server"] = true, vllm = true }

---A model path's base name, without .gguf (the default model id).
---@param path string
---@return string
function P.basename(path)
  return (path:gsub("/+$", ""):match("([^/]+)$") or path):gsub("%.gguf$", "")
end

local function append(argv, extra)
  for _, a in ipairs(extra or {}) do argv[#argv + 1] = tostring(a) end
  return argv
end

local function need_model(o)
  if not o.model then argerror("preset '%s' needs 'model'", o.preset) end
  return o.model
end

-- The interpreter's path from the `arg` table (its most negative index).
local function interpreter()
  local i, path = -1, nil
  while _G.arg and _G.arg[i] do
    path, i = _G.arg[i], i - 1
  end
  return path
end

local function file_exists(path)
  local f = path and io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

---Find the simulator: $MIRZA_SIM, next to the mirza executable, build/.
---@return string
function P.find_sim()
  local env = os.getenv("MIRZA_SIM")
  if env and env ~= "" then return env end
  local exe = interpreter()
  local dir = exe and exe:match("^(.*)/[^/]*$")
  for _, p in ipairs { dir and (dir .. "/mirza-sim"), "build/mirza-sim" } do
    if file_exists(p) then return p end
  end
  return "mirza-sim"
end

local kv_quant = { [8] = "q8", [4] = "q4" }
local kv_type = { [8] = "q8_0", [4] = "q4_0" }

---Command lines by preset: each takes the resolved options.
---@type table<string, fun(o: table): string[], table<string,string>?>
P.argv = {}

P.argv.mtplx = function(o)
  return append({
    o.bin or "mtplx", "serve", "--model", need_model(o), "--model-id", o.model_id,
    "--host", o.host, "--port", tostring(o.port), "--context-window", tostring(o.context_window),
    "--kv-quant", kv_quant[o.kv_bits] or "off", "--depth", tostring(o.depth), "--no-stats-footer",
  }, o.args)
end

P.argv["llama-server"] = function(o)
  local argv = {
    o.bin or "llama-server", "-m", need_model(o), "--host", o.host, "--port", tostring(o.port),
    "-c", tostring(o.context_window * o.parallel),
  }
  -- llama-server's own default is f16, and q8 KV crashes some models at
  -- load: quantize only when kv_bits was asked for.
  local kv = o.kv_explicit and kv_type[o.kv_bits]
  if kv then append(argv, { "-ctk", kv, "-ctv", kv }) end
  append(argv, { "-np", tostring(o.parallel) })
  if o.jinja then argv[#argv + 1] = "--jinja" end
  return append(append(argv, { "--alias", o.model_id }), o.args)
end

-- "host:port" as a daemon's own setting wants it ("[::1]:11434").
local function host_port(o)
  return ("%s:%d"):format(o.host:find(":", 1, true) and "[" .. o.host .. "]" or o.host, o.port)
end

-- `ollama serve` takes its settings from the environment: the address,
-- the context per request (Ollama multiplies it by the parallel slots
-- itself), and, only when asked, the slots and the KV quantization (which
-- needs flash attention).
P.argv.ollama = function(o)
  local env = { OLLAMA_HOST = host_port(o), OLLAMA_CONTEXT_LENGTH = tostring(o.context_window) }
  if o.parallel_explicit then env.OLLAMA_NUM_PARALLEL = tostring(o.parallel) end
  local kv = o.kv_explicit and kv_type[o.kv_bits]
  if kv then env.OLLAMA_KV_CACHE_TYPE, env.OLLAMA_FLASH_ATTENTION = kv, "1" end
  return append({ o.bin or "ollama", "serve" }, o.args), env
end

-- `vllm serve MODEL`: the context is per sequence; --max-num-seqs only
-- when asked (vLLM batches 256 by default, a cap of 1 would cripple it);
-- an 8-bit KV cache is fp8 (vLLM has no 4-bit one).
P.argv.vllm = function(o)
  local argv = {
    o.bin or "vllm", "serve", need_model(o), "--host", o.host, "--port", tostring(o.port),
    "--served-model-name", o.model_id, "--max-model-len", tostring(o.context_window),
  }
  if o.parallel_explicit then append(argv, { "--max-num-seqs", tostring(o.parallel) }) end
  if o.kv_explicit and o.kv_bits == 8 then append(argv, { "--kv-cache-dtype", "fp8" }) end
  return append(argv, o.args)
end

P.argv["mirza-sim"] = function(o)
  return append({
    o.bin or P.find_sim(), "--host", o.host, "--port", tostring(o.port), "--model-id", o.model_id,
    "--dialect", o.dialect, "--context-window", tostring(o.context_window),
  }, o.args)
end

P.argv.custom = function(o)
  if type(o.argv) ~= "table" or not o.argv[1] then argerror("preset 'custom' needs 'argv'") end
  local vars = { host = o.host, port = tostring(o.port), model = o.model or "", model_id = o.model_id or "" }
  local argv = {}
  for i, a in ipairs(o.argv) do
    argv[i] = tostring(a):gsub("{(%w[%w_]*)}", vars)
  end
  return argv
end

return P
