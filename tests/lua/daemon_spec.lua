-- mirza.daemon without processes: the command lines each preset builds
-- from the seed's settings, defaults, and option validation.
local daemon = require "mirza.daemon"

local function argv(opts)
  return daemon.resolve(opts).argv
end

describe("mirza.daemon presets", function()
  after_each(function() collectgarbage("collect") end)

  it("builds the MTPLX command line with the seed's defaults", function()
    assert.same({
      "mtplx", "serve", "--model", "pooyakn73/Qwen3.8-9B-Distill-MTPLX-Q6G64",
      "--model-id", "Qwen3.8-9B-Distill-MTPLX-Q6G64", "--host", "127.0.0.1", "--port", "8766",
      "--context-window", "16384", "--kv-quant", "q8", "--depth", "3", "--no-stats-footer",
    }, argv { model = "pooyakn73/Qwen3.8-9B-Distill-MTPLX-Q6G64" })
  end)

  it("maps KV bits to --kv-quant q8/q4/off and passes every setting", function()
    local a = argv { preset = "mtplx", model = "/m/qwen", model_id = "qwen38", host = "0.0.0.0", port = 9000,
      context_window = 8192, kv_bits = 4, depth = 2, bin = "/opt/mtplx", args = { "--api-key", "k" } }
    assert.same({ "/opt/mtplx", "serve", "--model", "/m/qwen", "--model-id", "qwen38", "--host", "0.0.0.0",
      "--port", "9000", "--context-window", "8192", "--kv-quant", "q4", "--depth", "2", "--no-stats-footer",
      "--api-key", "k" }, a)
    assert.equal("off", argv({ model = "m", kv_bits = 16 })[14])
    assert.equal("off", argv({ model = "m", kv_bits = 0 })[14])
  end)

  it("builds the llama-server command line (per-slot context, KV type, slots, jinja, alias)", function()
    -- KV cache left at llama-server's default (f16) unless kv_bits is asked for
    assert.same({ "llama-server", "-m", "/models/qwen3-0.6b.gguf", "--host", "127.0.0.1", "--port", "8080",
      "-c", "8192", "-np", "2", "--jinja", "--alias", "qwen3-0.6b" },
      argv { preset = "llama-server", model = "/models/qwen3-0.6b.gguf", port = 8080, context_window = 4096,
        parallel = 2 })
    assert.same({ "llama-server", "-m", "/models/qwen3-0.6b.gguf", "--host", "127.0.0.1", "--port", "8080",
      "-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0", "-np", "2", "--jinja", "--alias", "qwen3-0.6b" },
      argv { preset = "llama-server", model = "/models/qwen3-0.6b.gguf", port = 8080, context_window = 4096,
        parallel = 2, kv_bits = 8 })
    assert.same({ "llama-server", "-m", "m.gguf", "--host", "127.0.0.1", "--port", "8766", "-c", "16384",
      "-ctk", "q4_0", "-ctv", "q4_0", "-np", "1", "--alias", "id", "--flash-attn" },
      argv { preset = "llama-server", model = "m.gguf", model_id = "id", kv_bits = 4, jinja = false,
        args = { "--flash-attn" } })
    local a = argv { preset = "llama-server", model = "m.gguf", kv_bits = 16 }
    for _, x in ipairs(a) do assert.is_nil(x:match("^%-ct[kv]$")) end
  end)

  it("builds the Ollama command line and environment (address, context, slots and KV only when asked)", function()
    local o = daemon.resolve { preset = "ollama" }
    assert.same({ "ollama", "serve" }, o.argv)
    assert.same({ OLLAMA_HOST = "127.0.0.1:11434", OLLAMA_CONTEXT_LENGTH = "16384" }, o.env)
    assert.equal(11434, o.port)                -- Ollama's own port
    assert.equal("/api/version", o.health)     -- Ollama has no /health
    assert.is_nil(o.model_id)                  -- no model: any it serves
    o = daemon.resolve { preset = "ollama", model = "hf.co/org/Qwen3-GGUF:Q4_K_M", host = "::1", port = 9000,
      context_window = 8192, parallel = 4, kv_bits = 8, env = { OLLAMA_MODELS = "/m", OLLAMA_HOST = "[::1]:9001" },
      bin = "/opt/ollama", args = { "--verbose" } }
    assert.same({ "/opt/ollama", "serve", "--verbose" }, o.argv)
    assert.same({ OLLAMA_HOST = "[::1]:9001", OLLAMA_CONTEXT_LENGTH = "8192", OLLAMA_NUM_PARALLEL = "4",
      OLLAMA_KV_CACHE_TYPE = "q8_0", OLLAMA_FLASH_ATTENTION = "1", OLLAMA_MODELS = "/m" }, o.env) -- env wins
    assert.equal("hf.co/org/Qwen3-GGUF:Q4_K_M", o.model_id) -- an Ollama name is kept whole
    assert.equal("q4_0", daemon.resolve({ preset = "ollama", kv_bits = 4 }).env.OLLAMA_KV_CACHE_TYPE)
    assert.equal("http://127.0.0.1:11434/api/version", daemon.new({ preset = "ollama" }).health_url)
  end)

  it("builds the vLLM command line (per-sequence context, --max-num-seqs and fp8 KV only when asked)", function()
    local o = daemon.resolve { preset = "vllm", model = "Qwen/Qwen3-8B" }
    assert.same({ "vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8000",
      "--served-model-name", "Qwen3-8B", "--max-model-len", "16384" }, o.argv)
    assert.equal("/health", o.health)
    assert.is_nil(o.env)
    assert.same({ "/v/bin/vllm", "serve", "/m/qwen", "--host", "127.0.0.1", "--port", "8100",
      "--served-model-name", "q", "--max-model-len", "4096", "--max-num-seqs", "8", "--kv-cache-dtype", "fp8",
      "--tensor-parallel-size", "2" },
      argv { preset = "vllm", model = "/m/qwen", model_id = "q", port = 8100, context_window = 4096, parallel = 8,
        kv_bits = 8, bin = "/v/bin/vllm", args = { "--tensor-parallel-size", 2 } })
    for _, x in ipairs(argv { preset = "vllm", model = "m", kv_bits = 4 }) do
      assert.is_nil(x:match("^%-%-kv%-cache"), "vLLM has no 4-bit KV cache")
    end
  end)

  it("builds the mirza-sim command line", function()
    assert.same({ "/x/mirza-sim", "--host", "127.0.0.1", "--port", "5555", "--model-id", "mirza-sim",
      "--dialect", "llama", "--context-window", "16384", "--load-delay-ms", "100" },
      argv { preset = "mirza-sim", bin = "/x/mirza-sim", port = 5555, dialect = "llama",
        args = { "--load-delay-ms", 100 } })
  end)

  it("finds the simulator through $MIRZA_SIM or next to mirza", function()
    local sim = daemon.find_sim()
    assert.is_string(os.getenv("MIRZA_SIM"))
    assert.equal(os.getenv("MIRZA_SIM"), sim)
  end)

  it("fills placeholders of a custom argv", function()
    local o = daemon.resolve { preset = "custom", argv = { "srv", "--bind", "{host}:{port}", "{model_id}", "{x}" },
      port = 7000, model_id = "m", health = "/ready" }
    assert.same({ "srv", "--bind", "127.0.0.1:7000", "m", "{x}" }, o.argv)
    assert.equal("/ready", o.health)
  end)

  it("exposes the URLs and nothing is started by new()", function()
    local d = daemon.new { preset = "custom", argv = { "true" }, port = 7001, health = "/ping" }
    assert.equal("http://127.0.0.1:7001", d.url)
    assert.equal("http://127.0.0.1:7001/v1", d.base_url)
    assert.equal("http://127.0.0.1:7001/v1/chat/completions", d.chat_url)
    assert.equal("http://127.0.0.1:7001/ping", d.health_url)
    assert.is_false(d.adopted)
    assert.is_nil(d.pid)
    assert.equal("", d:log_tail())
    assert.equal("mirza.Daemon (custom http://127.0.0.1:7001, stopped, pid nil)", tostring(d))
  end)
end)

describe("mirza.daemon.is_loopback", function()
  it("knows this machine's loopback names and nothing else", function()
    for _, h in ipairs { "127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST" } do
      assert.is_true(daemon.is_loopback(h), h)
    end
    for _, h in ipairs { "10.0.0.1", "128.0.0.1", "gpu.example.com", "localhost.example.com", "127.0.0.1.nip.io",
      "::2", "0.0.0.0" } do
      assert.is_false(daemon.is_loopback(h), h)
    end
  end)
end)

describe("mirza.daemon option validation", function()
  local function fails(opts, pattern)
    local ok, err = pcall(daemon.resolve, opts)
    assert.is_false(ok)
    assert.truthy(tostring(err):find(pattern, 1, true), err)
  end

  it("raises on unknown options and wrong types", function()
    fails({ model = "m", bogus = 1 }, "unknown option 'bogus'")
    fails({ model = "m", port = "80" }, "option 'port' must be a number, got string")
    fails({ model = "m", keep_alive = 1 }, "option 'keep_alive' must be a boolean")
    fails({ model = "m", progress = "yes" }, "option 'progress' must be a boolean or function")
    fails("x", "options table expected")
  end)

  it("raises on bad values", function()
    fails({ preset = "sglang" }, "unknown preset 'sglang'")
    fails({ model = "m", port = 70000 }, "'port' must be an integer 0..65535")
    fails({ model = "m", port = 1.5 }, "'port' must be an integer")
    fails({ model = "m", port = 0 }, "'port' 0 cannot be supervised")
    fails({ model = "m", deadline = -1 }, "'deadline' must be >= 0")
    fails({ model = "m", restart = { tries = 2 } }, "unknown restart option 'tries'")
    fails({ preset = "custom", argv = { "x" }, health = "health" }, "'health' must be a path")
  end)

  it("without a model mtplx, llama-server and vllm can only adopt (no command line); custom needs an argv", function()
    for _, preset in ipairs { "mtplx", "llama-server", "vllm" } do
      local o = daemon.resolve { preset = preset }
      assert.is_nil(o.argv, preset)
      assert.is_nil(o.model_id, preset) -- and no model to insist on
    end
    assert.same({ "ollama", "serve" }, daemon.resolve({ preset = "ollama" }).argv) -- Ollama needs none
    fails({ preset = "custom" }, "preset 'custom' needs 'argv'")
  end)
end)
