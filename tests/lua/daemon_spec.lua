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
    fails({ preset = "vllm" }, "unknown preset 'vllm'")
    fails({ model = "m", port = 70000 }, "'port' must be an integer 0..65535")
    fails({ model = "m", port = 1.5 }, "'port' must be an integer")
    fails({ model = "m", port = 0 }, "'port' 0 cannot be supervised")
    fails({ model = "m", deadline = -1 }, "'deadline' must be >= 0")
    fails({ model = "m", restart = { tries = 2 } }, "unknown restart option 'tries'")
    fails({ preset = "custom", argv = { "x" }, health = "health" }, "'health' must be a path")
  end)

  it("requires a model for mtplx and llama-server, an argv for custom", function()
    fails({}, "preset 'mtplx' needs 'model'")
    fails({ preset = "llama-server" }, "preset 'llama-server' needs 'model'")
    fails({ preset = "custom" }, "preset 'custom' needs 'argv'")
  end)
end)
