-- Conversations that outlive the process (issue 18 item 7): e:save(path)
-- and engine.new{history = path} keep the history, session id, thinking
-- budget, model and name as JSON, written through a rename (never half a
-- file); a missing, cut, foreign or broken file is refused with its
-- reason ("io" or "history"); `mirza chat --continue [NAME]` in a child
-- process resumes the last (or the named) conversation of its per-user
-- directory, or a file (NAME.json in the current directory first, a bare
-- NAME only when no conversation has it), saved after every turn; the run
-- log names the conversation.
local mirza = require "mirza"
local engine = require "mirza.engine"
local conversation = require "mirza.conversation"
local prompt = require "mirza.prompt"
local json = mirza.json
local H = require "tests.helper"

local FAST = { "--tok-rate", "0", "--ttft-ms", "0" }

local write = H.write_file

local function tmpdir(suffix)
  local dir = H.tmpname(suffix or ".d")
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

-- Files in dir (names), sorted.
local listing = H.listing

describe("e:save and engine.new{history = path}", function()
  after_each(function() collectgarbage("collect") end)

  it("round-trip the history, session id, thinking budget, name and system prompt", function()
    local dir = tmpdir()
    local path = dir .. "/talk.json"
    local e = offline { session_id = "sess-1" }
    prompt.set_system(e.history, "Be brief.")
    prompt.add_turn(e.history, { { role = "user", content = "Bonjour « é »" } }, "Salut.")
    prompt.add_turn(e.history, { { role = "user", content = "Météo ?" } }, "",
      { tool_calls = { { id = "c1", type = "function", ["function"] = { name = "w", arguments = "{\"q\":1}" } } } })
    prompt.add(e.history, { role = "tool", tool_call_id = "c1", content = "{\"t\":3}" })
    prompt.add_turn(e.history, { { role = "user", content = "Et demain ?" } }, "Il", { interrupted = true })
    e:set_reasoning_budget(700)
    assert.is_true(e:save(path))
    assert.equal("talk", e.conversation_name) -- the file's name when none was set
    assert.same({ "talk.json" }, listing(dir)) -- no temporary file left
    local r = assert(offline { history = path })
    assert.same(e.history, r.history)
    assert.equal("Be brief.", r.history.system)
    assert.equal("sess-1", r.cfg.session_id)
    assert.equal(700, r.thinking.budget)
    assert.equal("talk", r.conversation_name)
    assert.same({ name = "talk", model = "m1", saved_at = r.conversation.saved_at, messages = 7 }, r.conversation)
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$", r.conversation.saved_at)
    assert.is_true(r.history.messages[7].interrupted)
    assert.equal(json.null, r.history.messages[4].content) -- an answer of tool calls alone
    -- saved again, the same bytes but the time
    local p2 = dir .. "/again.json"
    r.conversation_name = "talk"
    assert.is_true(r:save(p2))
    local a, b = json.decode(H.read_file(path)), json.decode(H.read_file(p2))
    a.saved_at, b.saved_at = nil, nil
    assert.same(a, b)
  end)

  it("an empty conversation is saved with an empty message list", function()
    local path = tmpdir() .. "/empty.json"
    assert.is_true(offline():save(path))
    assert.matches('"messages":%[%]', H.read_file(path))
    assert.same({}, assert(offline { history = path }).history.messages)
  end)

  it("a session id the script gives wins over the saved one", function()
    local path = tmpdir() .. "/s.json"
    assert.is_true(offline { session_id = "old" }:save(path))
    assert.equal("mine", assert(offline { history = path, session_id = "mine" }).cfg.session_id)
  end)

  it("a save replaces the file by a rename, never writes into it", function()
    local dir = tmpdir()
    local path = dir .. "/r.json"
    local e = offline()
    assert.is_true(e:save(path))
    local id1 = select(4, require("mirza.core").stat(path))
    local keep = assert(io.open(path)) -- a reader holding the old file reads it whole
    prompt.add_turn(e.history, { { role = "user", content = ("x"):rep(100000) } }, "y")
    assert.is_true(e:save(path))
    assert.not_equal(id1, select(4, require("mirza.core").stat(path)))
    assert.matches('"messages":%[%]', keep:read("a"))
    keep:close()
    assert.equal(2, #assert(offline { history = path }).history.messages)
    assert.same({ "r.json" }, listing(dir))
  end)

  it("a save that cannot be written: nil, message, io, nothing left behind", function()
    local dir = tmpdir()
    local ok, msg, code = offline():save(dir .. "/no/such/dir/c.json")
    assert.is_nil(ok)
    assert.equal("io", code)
    assert.matches("cannot save .*c%.json", msg)
    assert.same({}, listing(dir))
    assert.has_error(function() offline():save(42) end, "e:save: path must be a string, got number")
  end)

  it("a missing, cut, foreign, newer or broken file: nil, message, io|history", function()
    local dir = tmpdir()
    local good = dir .. "/good.json"
    local e = offline()
    prompt.add_turn(e.history, { { role = "user", content = "q" } }, "a")
    assert.is_true(e:save(good))
    local text = H.read_file(good)
    local function refused(content, code, pattern)
      local path = dir .. "/bad.json"
      if content then write(path, content) else os.remove(path) end
      local got, msg, c = offline { history = path }
      assert.is_nil(got)
      assert.equal(code, c, msg)
      assert.matches(pattern, msg)
    end
    refused(nil, "io", "cannot read the conversation: .*bad%.json")
    for _, cut in ipairs { 1, #text // 2, #text - 3 } do -- torn anywhere
      refused(text:sub(1, cut), "history", "bad%.json is not a saved conversation")
    end
    refused("", "history", "is not a saved conversation")
    refused('{"messages": []}', "history", "not a mirza conversation")
    refused('[1, 2]', "history", "not a mirza conversation")
    refused('{"mirza_conversation": 99, "messages": []}', "history", "format 99, newer")
    refused('{"mirza_conversation": 1}', "history", "no message list")
    refused('{"mirza_conversation": 1, "messages": [], "session_id": 5}', "history", "'session_id' is not a string")
    refused('{"mirza_conversation": 1, "messages": [{"role": "user", "content": "a"}, {"role": "wizard"}]}', "history",
      "message 2: unknown role wizard")
    assert.has_error(function() offline { history = 3 } end, "mirza.engine: 'history' must be a file path (string)")
  end)

  it("a resumed engine sends the saved turns again, in its session, and the run log names it", function()
    local sim = H.start_sim(FAST)
    finally(sim.stop)
    local dir, rec = tmpdir(), tmpdir(".rec")
    local path = dir .. "/trip.json"
    local function eng(o)
      local t = { base_url = sim.base .. "/v1", daemon = false, config_file = false, model = "mirza-sim",
        log = function() end, record = rec, body_extra = { mirza_sim = { text = "Réponse un." } } }
      for k, v in pairs(o or {}) do t[k] = v end
      return assert(engine.new(t))
    end
    local e = eng()
    e.conversation_name = "trip"
    assert(e:say("Question un ?", { answer = function() end }))
    assert.is_true(e:save(path))
    local r = eng { history = path }
    assert(r:say("Question deux ?", { answer = function() end }))
    local body
    for line in io.lines(rec .. "/000002.request") do body = line end
    body = json.decode(body)
    assert.same({ { role = "user", content = "Question un ?" }, { role = "assistant", content = "Réponse un." },
      { role = "user", content = "Question deux ?" } }, body.messages)
    assert.equal(e.cfg.session_id, body.metadata.session_id)
    local lines = {}
    for line in io.lines(rec .. "/runs.jsonl") do lines[#lines + 1] = json.decode(line) end
    assert.equal(2, #lines)
    assert.equal("trip", lines[1].conversation)
    assert.equal("trip", lines[2].conversation)
    assert.equal(lines[1].session, lines[2].session)
  end)
end)

describe("mirza chat --continue", function()
  local sim
  setup(function() sim = H.start_sim(FAST) end)
  teardown(function() sim.stop() end)

  -- Run scripts/chat.lua on `lines` with its state in `state` (and its
  -- recordings in `rec`, its current directory `cwd`, when given): {rc, out, err}.
  local function chat(state, lines, args, rec, cwd)
    local input, out, err = H.tmpname(".in"), H.tmpname(".out"), H.tmpname(".err")
    write(input, table.concat(lines, "\n") .. "\n")
    local cmd = ("%sXDG_STATE_HOME=%s MIRZA_CONFIG=/dev/null %s %s %s/scripts/chat.lua --sim --port %d --fifo %s %s"
      .. " >%s 2>%s"):format(cwd and ("cd " .. H.q(cwd) .. " && ") or "", H.q(state),
        rec and ("MIRZA_RECORD=" .. H.q(rec)) or "", H.q(H.mirza_bin),
        H.q(H.source), sim.port, H.q(input), args or "", H.q(out), H.q(err))
    local _, _, rc = os.execute(cmd)
    local r = { rc = rc, out = H.read_file(out), err = H.read_file(err) }
    os.remove(input) os.remove(out) os.remove(err)
    return r
  end

  local function saved(state, name)
    return assert(conversation.read(("%s/mirza/conversations/%s.json"):format(state, name)))
  end

  it("resumes the last conversation: its turns, session and thinking; saved after every turn", function()
    local state, rec = tmpdir(".state"), tmpdir(".rec")
    local r1 = chat(state, { "Bonjour", "/think on", "/quit" })
    assert.equal(0, r1.rc, r1.err)
    local name = r1.err:match("conversation (%d%d%d%d%-%d%d%-%d%d%-%d+)%)")
    assert.truthy(name, r1.err)
    assert.equal("700", H.file_mode(state .. "/mirza/conversations"))
    assert.equal(name .. "\n", H.read_file(state .. "/mirza/conversations/last"))
    local c1 = saved(state, name)
    assert.equal(2, #c1.messages)
    assert.equal(1024, c1.thinking.budget) -- /think on after the turn: saved too
    local r2 = chat(state, { "Encore", "/quit" }, "--continue", rec)
    assert.equal(0, r2.rc, r2.err)
    assert.truthy(r2.err:find(("chat: continuing %s: 2 messages, saved "):format(name), 1, true), r2.err)
    assert.truthy(r2.err:find("session " .. c1.session_id, 1, true), r2.err)
    local c2 = saved(state, name)
    assert.equal(4, #c2.messages)
    assert.same(c1.messages[1], c2.messages[1])
    assert.same(c1.messages[2], c2.messages[2])
    assert.equal("Encore", c2.messages[3].content)
    assert.equal(c1.session_id, c2.session_id)
    local body -- the resumed turn's request: the first exchange, then the new one, thinking on
    for line in io.lines(rec .. "/000002.request") do body = line end
    body = json.decode(body)
    assert.equal(3, #body.messages)
    assert.equal("Bonjour", body.messages[1].content)
    assert.equal(c1.messages[2].content, body.messages[2].content)
    assert.is_true(body.enable_thinking)
    local line = json.decode(H.read_file(rec .. "/runs.jsonl"))
    assert.equal(name, line.conversation)
    assert.equal(c1.session_id, line.session)
  end)

  it("--name names a new conversation, --continue NAME resumes it, /new starts another", function()
    local state = tmpdir(".state")
    local r1 = chat(state, { "Un", "/new", "Deux", "/quit" }, "--name work")
    assert.equal(0, r1.rc, r1.err)
    assert.truthy(r1.err:find("conversation work)", 1, true), r1.err)
    local other = r1.err:match("new conversation %(session mirza%-%x+%), saved as (%S+)")
    assert.truthy(other, r1.err)
    assert.equal(2, #saved(state, "work").messages)
    assert.equal("Un", saved(state, "work").messages[1].content)
    assert.equal("Deux", saved(state, other).messages[1].content)
    assert.equal(other .. "\n", H.read_file(state .. "/mirza/conversations/last"))
    local r2 = chat(state, { "Trois", "/quit" }, "--continue work")
    assert.equal(0, r2.rc, r2.err)
    assert.equal(4, #saved(state, "work").messages)
    assert.equal(2, #saved(state, other).messages)
    assert.equal("work\n", H.read_file(state .. "/mirza/conversations/last"))
    local r3 = chat(state, { "/quit" }, "--name work")
    assert.equal(2, r3.rc)
    assert.truthy(r3.err:find("a conversation named work exists: --continue work resumes it", 1, true), r3.err)
  end)

  it("nothing to continue, an unknown or bad name, a broken file: a clear message, exit 1 or 2", function()
    local state = tmpdir(".state")
    local r = chat(state, { "/quit" }, "--continue")
    assert.equal(1, r.rc)
    assert.matches("chat: no conversation to continue in .*/mirza/conversations", r.err)
    r = chat(state, { "/quit" }, "--continue nope")
    assert.equal(1, r.rc)
    assert.matches("chat: no conversation named nope in ", r.err)
    r = chat(state, { "/quit" }, "--name ../x")
    assert.equal(2, r.rc)
    assert.matches('"%.%./x" is not a conversation name', r.err)
    write(state .. "/mirza/conversations/torn.json", '{"mirza_conversation": 1, "messages": [')
    r = chat(state, { "/quit" }, "--continue torn")
    assert.equal(1, r.rc)
    assert.matches("chat: .*torn%.json is not a saved conversation", r.err)
  end)

  it("--continue PATH resumes a file an engine saved, and saves it back there", function()
    local state, dir = tmpdir(".state"), tmpdir()
    local path = dir .. "/mine.json"
    local e = offline { session_id = "from-a-script" }
    prompt.add_turn(e.history, { { role = "user", content = "Avant" } }, "Oui.")
    assert.is_true(e:save(path))
    local r = chat(state, { "Après", "/quit" }, "--continue " .. H.q(path))
    assert.equal(0, r.rc, r.err)
    assert.truthy(r.err:find("session from-a-script, conversation mine)", 1, true), r.err)
    local c = assert(conversation.read(path))
    assert.equal(4, #c.messages)
    assert.equal("Après", c.messages[3].content)
    assert.same({}, listing(state .. "/mirza/conversations")) -- nothing in the chat's own directory
  end)

  it("--continue NAME: NAME.json is the file here first, any other NAME the conversation first", function()
    local state, here = tmpdir(".state"), tmpdir(".cwd")
    local convs = state .. "/mirza/conversations"
    local function file(path, q) -- a conversation an engine saved: one exchange, question q
      local e = offline()
      prompt.add_turn(e.history, { { role = "user", content = q } }, "Oui.")
      assert.is_true(e:save(path))
    end
    -- talk.json here, no conversation talk: the file, saved back there
    file(here .. "/talk.json", "Fichier")
    local r = chat(state, { "Suite", "/quit" }, "--continue talk.json", nil, here)
    assert.equal(0, r.rc, r.err)
    assert.truthy(r.err:find("conversation talk)", 1, true), r.err)
    local c = assert(conversation.read(here .. "/talk.json"))
    assert.same({ "Fichier", "Suite" }, { c.messages[1].content, c.messages[3].content })
    assert.same({}, listing(convs))
    -- a conversation work and a file work here: --continue work is the conversation
    assert.equal(0, chat(state, { "Travail", "/quit" }, "--name work").rc)
    file(here .. "/work", "Ailleurs")
    r = chat(state, { "Encore", "/quit" }, "--continue work", nil, here)
    assert.equal(0, r.rc, r.err)
    assert.same({ "Travail", "Encore" }, { saved(state, "work").messages[1].content,
      saved(state, "work").messages[3].content })
    assert.equal(2, #assert(conversation.read(here .. "/work")).messages)
    -- no work.json here: --continue work.json is conversation work
    r = chat(state, { "Trois", "/quit" }, "--continue work.json", nil, here)
    assert.equal(0, r.rc, r.err)
    assert.equal(6, #saved(state, "work").messages)
    -- no conversation notes: the file notes here
    file(here .. "/notes", "Notes")
    r = chat(state, { "Plus", "/quit" }, "--continue notes", nil, here)
    assert.equal(0, r.rc, r.err)
    assert.equal("Plus", assert(conversation.read(here .. "/notes")).messages[3].content)
    assert.is_nil(io.open(convs .. "/notes.json"))
    -- neither: both places named
    r = chat(state, { "/quit" }, "--continue nope.json", nil, here)
    assert.equal(1, r.rc)
    assert.matches("chat: no conversation named nope in .*/mirza/conversations, nor a file nope%.json here", r.err)
  end)

  -- Two chats started at once (real child processes), each holding its
  -- input until both have named their conversation: {rc, err1, err2}.
  local function two_chats(state, args)
    local d = tmpdir(".two")
    local sh = { "set -m" }
    for k = 1, 2 do
      local fifo = ("%s/in%d"):format(d, k)
      sh[#sh + 1] = ("mkfifo %s"):format(H.q(fifo))
      sh[#sh + 1] = ("XDG_STATE_HOME=%s MIRZA_CONFIG=/dev/null %s %s/scripts/chat.lua --sim --port %d --fifo %s %s"
        .. " >/dev/null 2>%s/err%d & p%d=$!"):format(H.q(state), H.q(H.mirza_bin), H.q(H.source), sim.port,
          H.q(fifo), args or "", H.q(d), k, k)
    end
    -- both have claimed a name (their first line) before either gets a turn to save
    local said = "grep -q 'conversation\\|chat: a conv\\|chat: another' %s/err%d 2>/dev/null"
    sh[#sh + 1] = ("for i in $(seq 200); do " .. said .. " && " .. said .. " && break; sleep 0.05; done")
      :format(H.q(d), 1, H.q(d), 2)
    -- input only for a chat that took its name ("(session ..."): one refused
    -- may still be exiting (slow under ASan), and a write to a FIFO nobody
    -- opens would block the script to its timeout
    for k = 1, 2 do
      sh[#sh + 1] = ("grep -q '(session ' %s/err%d && printf 'Bonjour %d\\n/quit\\n' > %s/in%d"):format(H.q(d), k, k,
        H.q(d), k)
    end
    sh[#sh + 1] = "wait $p1; r1=$?; wait $p2; r2=$?; exit $((r1 * 16 + r2))"
    local script = d .. "/run.sh"
    write(script, table.concat(sh, "\n") .. "\n")
    local _, _, rc = os.execute(H.timeout_prefix(60) .. " sh " .. H.q(script))
    return rc, H.read_file(d .. "/err1") or "", H.read_file(d .. "/err2") or ""
  end

  it("two chats started in the same second save two conversations, each claiming its name at start", function()
    local state = tmpdir(".state")
    local names
    for _ = 1, 5 do -- in the same second (the default name's): else start again
      local rc, e1, e2 = two_chats(state)
      assert.equal(0, rc, e1 .. e2)
      names = { e1:match("conversation ([%d%-]+)%)"), e2:match("conversation ([%d%-]+)%)") }
      assert.truthy(names[1] and names[2], e1 .. e2)
      if names[1]:sub(1, 17) == names[2]:sub(1, 17) then break end
      names = nil
    end
    assert.truthy(names, "never two chats in one second")
    assert.are_not.equal(names[1], names[2])
    for k = 1, 2 do
      local c = saved(state, names[k])
      assert.equal(2, #c.messages)
      assert.equal("Bonjour " .. k, c.messages[1].content)
    end
    -- the claims are given up once saved: the conversations and `last` only
    for _, f in ipairs(listing(state .. "/mirza/conversations")) do
      assert.truthy(f == "last" or f:find("%.json$"), f)
    end
    -- the same --name twice at once: one has it, the other is told, exit 2, and nothing is lost
    local rc, e1, e2 = two_chats(state, "--name same")
    local ok1 = e1:find("conversation same)", 1, true) ~= nil
    assert.are_not.equal(ok1, e2:find("conversation same)", 1, true) ~= nil, e1 .. e2)
    assert.equal(ok1 and 2 or 32, rc, e1 .. e2)
    assert.truthy((ok1 and e2 or e1):find("chat: another mirza chat is starting conversation same", 1, true)
      or (ok1 and e2 or e1):find("chat: a conversation named same exists", 1, true), e1 .. e2)
    assert.equal(2, #saved(state, "same").messages)
  end)

  it("--no-save keeps nothing", function()
    local state = tmpdir(".state")
    local r = chat(state, { "Bonjour", "/quit" }, "--no-save")
    assert.equal(0, r.rc, r.err)
    assert.same({}, listing(state))
  end)
end)
