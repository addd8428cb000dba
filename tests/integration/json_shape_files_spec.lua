-- JSON keeps its shape in the files mirza writes back (issue 31 item 8):
-- a saved conversation with an empty `tool_calls` list and a tool result
-- holding `[]` loads and saves again to the same bytes; a recorded request
-- whose body was decoded from JSON holds that JSON byte for byte, and
-- replays (--replay-match body) from a body decoded the same way.
local mirza = require "mirza"
local engine = require "mirza.engine"
local prompt = require "mirza.prompt"
local H = require "tests.helper"

local json = mirza.json

local function tmpdir()
  local dir = H.tmpname(".d")
  os.execute("mkdir -p " .. H.q(dir))
  finally(function() os.execute("rm -rf " .. H.q(dir)) end)
  return dir
end

-- An engine that contacts nothing until a turn (no daemon, no config file).
local function offline(opts)
  local o = { base_url = "http://127.0.0.1:1/v1", daemon = false, config_file = false, model = "m1",
    log = function() end }
  for k, v in pairs(opts or {}) do o[k] = v end
  return engine.new(o)
end

-- A saved file's text without its time.
local function timeless(path)
  return (H.read_file(path):gsub('"saved_at":"[^"]*"', '"saved_at":""'))
end

describe("a saved conversation", function()
  after_each(function() collectgarbage("collect") end)

  it("with empty lists in its messages: saved, loaded and saved again is byte-identical", function()
    local dir = tmpdir()
    local e = offline { session_id = "s-shape" }
    prompt.add(e.history, { role = "user", content = "Bonjour" })
    prompt.add(e.history, { role = "assistant", content = "Rien à appeler.", tool_calls = json.array {} })
    prompt.add(e.history, { role = "assistant", content = json.null, tool_calls = { { id = "c1", type = "function",
      ["function"] = { name = "list", arguments = "{}" } } } })
    prompt.add(e.history, { role = "tool", tool_call_id = "c1", content = "[]" })
    prompt.add(e.history, { role = "user", content = { { type = "text", text = "et {} ?" } } })
    local paths = { dir .. "/a.json", dir .. "/b.json", dir .. "/c.json" }
    assert.is_true(e:save(paths[1]))
    local text = timeless(paths[1])
    assert.truthy(text:find('"tool_calls":[]', 1, true), text)
    for i = 2, 3 do
      local r = assert(offline { history = paths[i - 1] })
      r.conversation_name = e.conversation_name
      assert.is_true(r:save(paths[i]))
      assert.equal(text, timeless(paths[i]))
    end
  end)
end)

describe("a recorded request with a decoded body", function()
  local sim
  setup(function() sim = H.start_sim { "--tok-rate", "0", "--ttft-ms", "0" } end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local BODY = '{"messages":[{"content":"un","role":"user"},{"content":"ok","role":"assistant","tool_calls":[]},'
    .. '{"content":"deux","role":"user"}],"model":"mirza-sim","stream":true,"x_meta":{"empty":{},"list":[]}}'

  it("holds the JSON byte for byte and replays by body from the same decoded JSON", function()
    local dir = tmpdir()
    local function run(url, record)
      local s <close> = mirza.open { url = url, body = assert(json.decode(BODY)), record = record }
      return H.drain(s, 30).events
    end
    local evs = run(sim.url, dir)
    assert.equal("done", evs[#evs].type)
    local sent = H.read_file(dir .. "/000001.request"):match("\n\n(.*)$")
    assert.equal(BODY, sent)
    local replay = H.start_sim { "--replay-dir", dir, "--replay-match", "body" }
    local again = run(replay.url)
    replay.stop()
    assert.same(evs, again)
  end)
end)
