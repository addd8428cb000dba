-- Requiring a module never changes how another behaves (issue 19): no
-- module of lua/mirza replaces the Stream methods, `mirza.core.open` or
-- `mirza.sleep` (each is required in a fresh `mirza -e` state and the
-- functions compared by identity), and the cooperative behaviour inside
-- `mirza.loop` tasks comes from the core itself asking "am I in a task?":
-- tasks streaming at once interleave, a sleep or a next(timeout) in a task
-- lets the others run, and outside any task (the loop loaded) a pull still
-- blocks and works, in a plain coroutine too.
local mirza = require "mirza"
local loop = require "mirza.loop"
local H = require "tests.helper"

-- The child: snapshot what must not change, require the module, compare.
-- Prints "same" or "changed: <names>" (or "require failed: <message>").
local CHILD = [==[
local core = require "mirza.core"
local mod = ...
local function snap()
  local s = core.open { url = "http://127.0.0.1:9/" } -- a real stream's metatable
  local mt = getmetatable(s)
  s:close()
  local t = { ["core.open"] = core.open, ["core.sleep"] = core.sleep }
  for k, v in pairs(mt) do t["mt." .. tostring(k)] = v end
  for k, v in pairs(mt.__index) do t["Stream." .. tostring(k)] = v end
  local m = package.loaded.mirza
  if m then t["mirza.sleep"], t["mirza.open"] = m.sleep, m.open end
  return t
end
if mod ~= "mirza" then require "mirza" end
local before = snap()
local ok, err = pcall(require, mod)
if not ok then print("require failed: " .. tostring(err)) return end
local after, changed = snap(), {}
for k, v in pairs(before) do if after[k] ~= v then changed[#changed + 1] = k end end
for k in pairs(after) do
  if before[k] == nil and not (mod == "mirza" and k:match("^mirza%.")) then changed[#changed + 1] = k .. " (new)" end
end
if mod == "mirza" and after["mirza.sleep"] ~= core.sleep then changed[#changed + 1] = "mirza.sleep (not core.sleep)" end
table.sort(changed)
print(#changed == 0 and "same" or "changed: " .. table.concat(changed, ", "))
]==]

local function modules()
  local p = assert(io.popen("ls " .. H.q(H.source .. "/lua/mirza")))
  local list = {}
  for f in p:lines() do
    local name = f:match("^([%w_]+)%.lua$")
    if name and not name:match("^_meta") then list[#list + 1] = name == "init" and "mirza" or "mirza." .. name end
  end
  p:close()
  table.sort(list)
  return list
end

local function in_child(mod)
  local script = H.tmpname(".lua")
  local f = assert(io.open(script, "w"))
  f:write(CHILD)
  f:close()
  local p = assert(io.popen(("%s %s %s 2>&1"):format(H.q(H.mirza_bin), H.q(script), H.q(mod))))
  local out = p:read("a")
  p:close()
  os.remove(script)
  return (out:gsub("%s+$", ""))
end

describe("requiring a module", function()
  it("leaves the Stream methods, mirza.core.open and mirza.sleep as they were, for every module", function()
    local list = modules()
    assert.is_true(#list >= 20, "modules found: " .. #list)
    local seen = {}
    for _, mod in ipairs(list) do seen[mod] = true end
    for _, must in ipairs { "mirza", "mirza.loop", "mirza.pool", "mirza.batch", "mirza.engine", "mirza.tools" } do
      assert.is_true(seen[must], must .. " not among the modules")
    end
    local want, got = {}, {}
    for _, mod in ipairs(list) do want[mod], got[mod] = "same", in_child(mod) end
    assert.same(want, got)
  end)
end)

-- A distinct text per stream, so the events of each can be told apart.
local function words(tag, n)
  local t = {}
  for i = 1, n do t[i] = tag .. i end
  return table.concat(t, " ")
end

describe("the core's pulls inside mirza.loop tasks", function()
  local sim
  setup(function()
    sim = H.start_sim { "--parallel", "16", "--ttft-ms", "0", "--tok-rate", "400", "--heartbeat-ms", "0" }
  end)
  teardown(function() sim.stop() end)
  after_each(function() collectgarbage("collect") end)

  local function open(text, ctl)
    local body = H.chat_body("coop")
    body.mirza_sim = ctl or {}
    body.mirza_sim.text = text
    return mirza.open { url = sim.url, body = body, stall_timeout = 60 }
  end

  it("interleaves two tasks streaming at once (s:next and for ev in s:events())", function()
    local l, order = loop.new(), {}
    local function reader(tag, use_next)
      return function()
        local s <close> = open(words(tag, 150))
        local text = {}
        local function take(ev)
          if ev.type == "text" then
            text[#text + 1] = ev.text
            order[#order + 1] = tag
          end
        end
        if use_next then
          while true do
            local ev = s:next()
            if not ev then break end
            take(ev)
          end
        else
          for ev in s:events() do take(ev) end
        end
        return table.concat(text)
      end
    end
    local a, b = l:spawn(reader("a", true)), l:spawn(reader("b", false))
    l:run()
    assert.same({ true, words("a", 150) }, { a:join() })
    assert.same({ true, words("b", 150) }, { b:join() })
    local switches = 0
    for i = 2, #order do if order[i] ~= order[i - 1] then switches = switches + 1 end end
    -- they alternate as tokens come (400/s each); and even when a task finds
    -- its whole stream queued (a slow machine), it lets the other run after
    -- loop.SLICE (64) events: a, b, a, b at the least
    assert.is_true(switches >= 3, "switches between the tasks: " .. switches .. " " .. table.concat(order))
  end)

  it("lets the other tasks run while a task sleeps", function()
    local l = loop.new()
    local sleeper = l:spawn(function() mirza.sleep(5) end) -- a blocking sleep would end first
    local sleeper_state
    local reader = l:spawn(function()
      local s <close> = open(words("r", 5))
      local r = H.drain(s)
      sleeper_state = sleeper.status
      sleeper:cancel()
      return r.text
    end)
    l:run()
    assert.equal("waiting", sleeper_state)
    assert.same({ true, words("r", 5) }, { reader:join() })
    assert.equal("cancelled", select(3, sleeper:join()))
  end)

  it("times a task's s:next(timeout) out without blocking the others, and gives an event that comes in time", function()
    local l = loop.new()
    local waiting, ran_meanwhile, a_done = false, 0, false
    local a = l:spawn(function()
      local s <close> = open("late", { ttft_ms = 5000 })
      waiting = true
      local ev, msg, code = s:next(0.2)
      a_done = true
      return ev, msg, code
    end)
    local b = l:spawn(function()
      for _ = 1, 500 do -- bounded: a sleep that blocks would never let a finish
        if a_done then return true end
        if waiting then ran_meanwhile = ran_meanwhile + 1 end
        mirza.sleep(0.01)
      end
      return false
    end)
    local c = l:spawn(function()
      local s <close> = open("soon")
      local ev = s:next(30)
      while ev and ev.type ~= "text" do ev = s:next(30) end
      return ev and ev.text
    end)
    l:run()
    assert.same({ true, nil, "timeout", "timeout" }, { a:join() })
    assert.same({ true, true }, { b:join() })
    assert.is_true(ran_meanwhile >= 1)
    assert.same({ true, "soon" }, { c:join() })
  end)

  it("makes s:next_batch cooperative too", function()
    local l = loop.new()
    local waiting, ran_meanwhile, a_done = false, 0, false
    local a = l:spawn(function()
      local s <close> = open("late", { ttft_ms = 5000 })
      waiting = true
      local b, msg, code = s:next_batch(0.2)
      a_done = true
      return b, msg, code
    end)
    local b = l:spawn(function()
      for _ = 1, 500 do -- bounded: a sleep that blocks would never let a finish
        if a_done then return true end
        if waiting then ran_meanwhile = ran_meanwhile + 1 end
        mirza.sleep(0.01)
      end
      return false
    end)
    local c = l:spawn(function()
      local s <close> = open(words("n", 10))
      local text = {}
      while true do
        local batch = s:next_batch()
        if not batch then break end
        for _, ev in ipairs(batch) do if ev.type == "text" then text[#text + 1] = ev.text end end
      end
      return table.concat(text)
    end)
    l:run()
    assert.same({ true, nil, "timeout", "timeout" }, { a:join() })
    assert.same({ true, true }, { b:join() })
    assert.is_true(ran_meanwhile >= 1)
    assert.same({ true, words("n", 10) }, { c:join() })
  end)

  it("wakes a task waiting on a stream another task closes (its pull raises)", function()
    local l = loop.new { on_error = function() end } -- joined below
    local s = open("late", { ttft_ms = 5000 })
    local waiter = l:spawn(function() return s:next() end)
    l:spawn(function()
      while waiter.status ~= "waiting" do mirza.yield() end
      s:close()
    end)
    -- a timer pending all along: the scheduler's last resort (wake every
    -- waiter when nothing can happen) never comes into play
    local watcher = l:spawn(function()
      for _ = 1, 500 do
        if waiter:done() then return true end
        mirza.sleep(0.01)
      end
      return false
    end)
    l:run()
    assert.same({ true, true }, { watcher:join() })
    local ok, msg = waiter:join()
    assert.is_nil(ok)
    assert.matches("attempt to use a closed stream", msg, 1, true)
  end)

  it("closes the streams a task opened when it is cancelled", function()
    local l = loop.new()
    local opened
    local t = l:spawn(function()
      opened = open("late", { ttft_ms = 5000 })
      return opened:next()
    end)
    l:spawn(function()
      while t.status ~= "waiting" do mirza.yield() end
      t:cancel()
    end)
    l:run()
    assert.is_true(opened:closed())
  end)

  it("blocks and works outside any task, with the loop loaded, in a plain coroutine too", function()
    assert.is_nil(loop.current())
    local s <close> = open(words("o", 5))
    -- a plain coroutine is not a task: its pull blocks instead of yielding
    local ev = coroutine.wrap(function()
      local e = s:next(30)
      while e and e.type ~= "text" do e = s:next(30) end
      return e
    end)()
    assert.equal(words("o", 5), ev.text .. H.drain(s, 30).text)
    local late <close> = open("late", { ttft_ms = 5000 })
    local t0 = mirza.now()
    assert.same({ nil, "timeout", "timeout" }, { late:next(0.1) })
    assert.is_true(mirza.now() - t0 >= 0.09)
    t0 = mirza.now()
    mirza.sleep(0.05)
    assert.is_true(mirza.now() - t0 >= 0.045)
  end)
end)
