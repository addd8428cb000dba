-- mirza.repetition: true positives (loops are cut, early, with the right
-- line) and false positives (lists, code, poetry with refrains never are).
local repetition = require "mirza.repetition"
local pipeline = require "mirza.pipeline"

-- Feed `text` in chunks of `size` bytes (1 = byte by byte, as a worst case
-- of token boundaries); returns triggered, line, count, the guard and the
-- number of bytes fed when it triggered.
local function run(text, size, opts)
  local g = repetition.new(opts)
  size = size or 5
  for i = 1, #text, size do
    if g:feed(text:sub(i, i + size - 1)) then return true, g.line, g.count, g, i + size - 1 end
  end
  local hit, line, count = g:check("")
  return hit, line, count, g, #text
end

-- A text must pass clean whatever the chunking.
local function assert_clean(text, opts)
  for _, size in ipairs({ 1, 4, 17, #text }) do
    local hit, line, count, g = run(text, size, opts)
    assert.is_false(hit, ("false trigger (chunks of %d) on %q x%s by rule %s"):format(
      size, tostring(line), tostring(count), tostring(g.rule)))
  end
end

local function rep(s, n) return s:rep(n) end

-- ---------------------------------------------------------------- texts
local LISTS = {
  recipe = [[
Here is a simple recipe for a French omelette:

1. Crack three eggs into a bowl.
2. Add a pinch of salt and beat them with a fork.
3. Melt a knob of butter in a non-stick pan over medium heat.
4. Pour in the eggs and stir gently with a spatula.
5. When the eggs are almost set, stop stirring.
6. Fold the omelette in half and slide it onto a plate.
7. Serve immediately with a green salad.
8. Optionally, add chives or grated cheese before folding.
9. Clean the pan while it is still warm.
10. Enjoy your meal.
]],
  shopping = [[
Liste de courses pour la semaine :
- pain de campagne
- beurre demi-sel
- lait entier
- œufs frais
- pommes de terre
- carottes
- oignons
- fromage râpé
- café moulu
- jus d'orange
- yaourts nature
- farine de blé
]],
  placeholders = [[
Template:
- item
- item
- item
- item
- item
- item
- item
- item
- item
- item
- [ ] todo
- [ ] todo
- [ ] todo
- [ ] todo
- [ ] todo
- [ ] todo
- [ ] todo
]],
  structured = [[
Comparison of the three plans:

- **Basic**: 5 GB of storage, email support, one user.
- **Standard**: 50 GB of storage, chat support, five users.
- **Premium**: 500 GB of storage, phone support, unlimited users.

Each plan includes:
* automatic backups
* two-factor authentication
* a mobile application
* monthly usage reports

Pros and cons:
1) The Basic plan is cheap but limited.
2) The Standard plan is the best value for small teams.
3) The Premium plan is expensive but complete.
]],
}

local CODE = {
  lua = [[
local function parse(path)
  local f, err = io.open(path)
  if not f then
    return nil, err
  end
  local data = f:read("a")
  f:close()
  if not data then
    return nil
  end
  for line in data:gmatch("[^\n]+") do
    if line:find("^#") then
      goto continue
    end
    if line == "" then
      goto continue
    end
    ::continue::
  end
  return data
end

local function check(t)
  if not t.a then
    return nil
  end
  if not t.b then
    return nil
  end
  if not t.c then
    return nil
  end
  if not t.d then
    return nil
  end
  if not t.e then
    return nil
  end
  if not t.f then
    return nil
  end
  if not t.g then
    return nil
  end
  return true
end
]],
  c = [[
static int walk(struct node *n, int depth)
{
    if (!n) {
        return 0;
    }
    if (depth > MAX_DEPTH) {
        return -1;
    }
    for (int i = 0; i < n->count; i++) {
        if (n->kids[i]) {
            if (walk(n->kids[i], depth + 1) < 0) {
                return -1;
            }
        }
    }
    return 0;
}



int main(void)
{
    if (init() < 0) {
        return 1;
    }
    if (run() < 0) {
        return 1;
    }
    return 0;
}
]],
  go = [[
func load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(c.Port)
	if err != nil {
		return nil, err
	}
	k, err := readKey(c.KeyFile)
	if err != nil {
		return nil, err
	}
	t, err := time.ParseDuration(c.Timeout)
	if err != nil {
		return nil, err
	}
	l, err := newLogger(c.LogLevel)
	if err != nil {
		return nil, err
	}
	c.url, c.port, c.key, c.timeout, c.log = u, p, k, t, l
	return &c, nil
}
]],
  python = [[
class Handler:
    def on_open(self):
        pass

    def on_close(self):
        pass

    def on_error(self, err):
        pass

    def on_message(self, msg):
        pass

    def on_ping(self):
        pass

    def on_pong(self):
        pass

    def on_timeout(self):
        return None

    def on_retry(self):
        return None

    def on_reset(self):
        return None
]],
  nested = rep("  end\n", 12) .. rep("}\n", 15) .. rep("\n", 30) .. rep("))))", 20) .. "\n"
    .. rep("| --- ", 12) .. "|\n" .. rep("=", 80) .. "\n",
  json = [[
{
  "servers": [
    { "name": "alpha", "enabled": true, "retry": 3 },
    { "name": "beta", "enabled": true, "retry": 3 },
    { "name": "gamma", "enabled": true, "retry": 3 },
    { "name": "delta", "enabled": true, "retry": 3 },
    { "name": "epsilon", "enabled": true, "retry": 3 },
    { "name": "zeta", "enabled": true, "retry": 3 },
    { "name": "eta", "enabled": true, "retry": 3 },
    { "name": "theta", "enabled": true, "retry": 3 }
  ]
}
]],
}

local POETRY = {
  song = [[
The morning train is leaving town,
the platform lamps are burning down.
Oh, carry me home, carry me home,
over the hills where the rivers roam.

My mother waits beside the door,
the kettle singing as before.
Oh, carry me home, carry me home,
over the hills where the rivers roam.

The fields are gold, the sky is wide,
I hear the bells on the other side.
Oh, carry me home, carry me home,
over the hills where the rivers roam.

And when the night begins to fall,
I'll hear her voice above it all.
Oh, carry me home, carry me home,
over the hills where the rivers roam.
]],
  chanson = [[
Il pleut sur la ville endormie,
les toits brillent sous la pluie.
Reviens, reviens, mon amie,
reviens avant la fin de la nuit.

Les rues sont vides et les cafés
ferment leurs portes l'un après l'autre.
Reviens, reviens, mon amie,
reviens avant la fin de la nuit.

Je garde ta chaise près du feu,
et ton écharpe sur le banc bleu.
Reviens, reviens, mon amie,
reviens avant la fin de la nuit.
]],
  refrain_lines = [[
Sing along, sing along,
the summer days are never long.
Sing along, sing along,
sing along, sing along.
We walked along the silver shore
and counted stars we'd seen before.
Sing along, sing along,
the summer days are never long.
]],
  doubled_chorus = [[
Hold on, hold on, the light is coming.
Hold on, hold on, the light is coming.
Hold on, hold on, the light is coming.
The road is long and we are running,
the river cold and the wind is humming.
Hold on, hold on, the light is coming.
Hold on, hold on, the light is coming.
Hold on, hold on, the light is coming.
Hold on, hold on, the light is coming.
Our hearts are tired but still drumming,
and every night a new day's coming.
La la la la la la la la la la la la la la la la la la la la la la la la.
Na na na na na na na na na na na na na na na na na na na na na na na.
Oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh oh.
]],
}

-- A healthy reasoning trace with the usual hesitations.
local REASONING = [[
The user asks how many apples remain. Let me think. They start with 12 apples.
They give away 5, so 12 - 5 = 7. Wait, they also buy 3 more. So 7 + 3 = 10.
Wait, let me re-read the question. "Then she eats two of them." So 10 - 2 = 8.
Hmm, but does "them" refer to the new apples? Let me reconsider. It says two of
them, meaning two apples in general. So 8 apples remain.
Wait, let me double-check the first step. 12 - 5 = 7, yes.
Let me verify the whole chain again: 12, minus 5 is 7, plus 3 is 10, minus 2 is 8.
Wait, is there any trick? No, the answer is 8.
So I'll answer: 8 apples.
]]

describe("mirza.repetition", function()
  after_each(function() collectgarbage("collect") end)

  describe("false positives", function()
    for name, text in pairs(LISTS) do
      it("ignores an ordinary list: " .. name, function() assert_clean(text) end)
    end
    for name, text in pairs(CODE) do
      it("ignores code: " .. name, function() assert_clean(text) end)
    end
    for name, text in pairs(POETRY) do
      it("ignores poetry with refrains: " .. name, function() assert_clean(text) end)
    end
    it("ignores 20 placeholder lines in a row", function()
      assert_clean("Fill in:\n" .. rep("- item\n", 20) .. rep("* TODO\n", 20) .. rep("end\n", 20))
    end)
    it("ignores a healthy reasoning trace with a few Waits", function()
      assert_clean(REASONING)
    end)
    it("ignores code inside ``` fences even when a line repeats", function()
      local lines = {}
      for i = 1, 10 do
        lines[#lines + 1] = ("    x%d := fetch(%d)"):format(i, i)
        lines[#lines + 1] = "    check the result for errors"
      end
      local fenced = "Here:\n```go\n" .. table.concat(lines, "\n") .. "\n```\nDone.\n"
      assert_clean(fenced)
      -- the same lines unfenced are a loop of a prose line: the count rule fires
      assert.is_true((run(table.concat(lines, "\n") .. "\n")))
    end)
    it("ignores all texts together, in one stream", function()
      local all = {}
      for _, set in ipairs({ LISTS, CODE, POETRY }) do
        for _, t in pairs(set) do all[#all + 1] = t end
      end
      all[#all + 1] = REASONING
      assert_clean(table.concat(all, "\n"))
    end)
  end)

  describe("true positives", function()
    it("cuts a line repeated 8+ times, early", function()
      local text = "Let me look at the problem.\n" .. rep("I need to check the constraints again.\n", 12)
      local hit, line, count, g, at = run(text, 5)
      assert.is_true(hit)
      assert.equal("I need to check the constraints again.", line)
      assert.equal(6, count)
      assert.equal("cycle", g.rule)
      assert.is_true(at < #text * 0.7, "cut early, at byte " .. at)
    end)

    it("cuts 'Wait, let me reconsider.' looping on its own", function()
      local hit, line, count = run("So the area is 12. " .. rep("Wait, let me reconsider. ", 10), 3)
      assert.is_true(hit)
      assert.equal("Wait, let me reconsider.", line)
      assert.equal(6, count)
    end)

    it("cuts 'Wait, let me reconsider.' between ever-different attempts", function()
      local parts = {}
      for i = 1, 12 do
        parts[#parts + 1] = ("Wait, let me reconsider. Maybe the answer is %d because of step %d.\n"):format(10 + i, i)
      end
      local hit, line, count, g = run(table.concat(parts), 4)
      assert.is_true(hit)
      assert.equal("count", g.rule)
      assert.equal("Wait, let me reconsider.", line)
      assert.equal(8, count)
    end)

    it("cuts a phrase looping without line breaks", function()
      local text = "The list goes on: apples, pears, " .. rep("and so on ", 30)
      local hit, line, count, g, at = run(text, 2)
      assert.is_true(hit)
      assert.equal("phrase", g.rule)
      assert.equal("and so on", line)
      assert.equal(8, count)
      assert.equal(112, at) -- 8 repetitions in, of 30
      assert.equal(333, #text)
    end)

    it("cuts a French phrase loop fed byte by byte", function()
      local hit, line, count, g, at = run("Donc il faut vérifier " .. rep("encore et encore ", 20), 1)
      assert.is_true(hit)
      assert.equal("phrase", g.rule)
      assert.equal("encore et encore", line)
      assert.equal(8, count)
      assert.equal(158, at)
    end)

    it("cuts a loop of two alternating lines", function()
      local text = rep("First, compute the total cost of the items.\nThen, subtract the discount from it.\n", 10)
      local hit, line, count, g = run(text, 6)
      assert.is_true(hit)
      assert.equal("cycle", g.rule)
      assert.equal(6, count)
      assert.is_truthy(line == "First, compute the total cost of the items."
        or line == "Then, subtract the discount from it.")
    end)

    it("cuts a three-sentence cycle inside one paragraph", function()
      local cyc = "The user wants a poem. I should write four lines. Let me start with the title. "
      local hit, line, count, g = run(rep(cyc, 8), 9)
      assert.is_true(hit)
      assert.equal("cycle", g.rule)
      assert.equal("The user wants a poem.", line)
      assert.equal(6, count)
    end)

    it("cuts a numbered list that loops on the same item", function()
      local parts = {}
      for i = 1, 10 do parts[#parts + 1] = ("%d. Check the input file again.\n"):format(i) end
      local hit, line, count = run(table.concat(parts), 7)
      assert.is_true(hit)
      assert.equal("Check the input file again.", line)
      assert.equal(6, count)
    end)

    it("normalises case, spacing and trailing punctuation", function()
      local text = "Let me verify.\nlet me  VERIFY!\nLet me verify\n- Let me verify.\n"
        .. "Let me verify...\n  Let me verify ?\n"
      local hit, _, count = run(text, 3)
      assert.is_true(hit)
      assert.equal(6, count)
    end)

    it("cuts a loop of lines too short for the line rules, late", function()
      local text = "Let me think about it.\n" .. rep("Wait.\n", 40)
      local hit, line, count, g, at = run(text, 3)
      assert.is_true(hit)
      assert.equal("phrase", g.rule)
      assert.equal("wait.", line)
      assert.equal(32, count)
      assert.is_true(at < #text)
    end)

    it("stays triggered and reports the same line", function()
      local g = repetition.new()
      g:check(rep("This is definitely the same sentence.\n", 7))
      assert.is_true(g.triggered)
      local hit, line = g:feed("Something completely different.\n")
      assert.is_true(hit)
      assert.equal("This is definitely the same sentence.", line)
    end)
  end)

  describe("thresholds", function()
    it("are configurable", function()
      local text = rep("We should double-check this step.\n", 4)
      assert.is_false((run(text)))
      local hit, _, count = run(text, 5, { repeats = 3 })
      assert.is_true(hit)
      assert.equal(3, count)
      -- raising the phrase bar lets a 30-times phrase through
      assert.is_false((run(rep("and so on ", 30), 5, { phrase_repeats = 40 })))
    end)

    it("a refrain repeated 4 times among other lines never reaches the defaults", function()
      local verse = { "The wind is cold tonight,", "the harbour lights are low,", "I hold the lantern tight,",
        "and wait for you to show." }
      local parts = {}
      for v = 1, 4 do
        for _, l in ipairs(verse) do parts[#parts + 1] = l .. " (" .. v .. ")" end
        parts[#parts + 1] = "Come home, my sailor, come home."
      end
      assert_clean(table.concat(parts, "\n") .. "\n")
    end)

    it("a wrong threshold raises, naming it; keys that are not thresholds are the stage's", function()
      assert.has_error(function() repetition.new({ repeats = "six" }) end,
        "mirza.repetition: 'repeats' must be a number from 0 to 1e6 (got \"six\")")
      assert.has_error(function() repetition.new({ max_phrase = 5000 }) end,
        "mirza.repetition: 'max_phrase' must be a number from 0 to 4096 (bytes) (got 5000)")
      assert.has_error(function() repetition.new({ window = -1 }) end,
        "mirza.repetition: 'window' must be a number from 0 to 1e6 (got -1)")
      assert.is_false((repetition.new({ channels = { text = true }, on_cut = print, repeats = 3 }):feed("x")))
      -- mirza.core.guard itself takes every threshold and nothing else
      local core = require "mirza.core"
      local all = {}
      for k, v in pairs(repetition.DEFAULTS) do all[k] = v end
      all.channels = {}
      assert.has_error(function() core.guard(all) end, "mirza.repetition: unknown option 'channels'")
      all.channels, all.count = nil, nil
      assert.has_error(function() core.guard(all) end,
        "mirza.repetition: 'count' must be a number from 0 to 1e6 (got nil)")
    end)
  end)

  describe("the guard object", function()
    it("closes once, then raises; a method on another object raises", function()
      local g = repetition.new()
      assert.is_false(g:closed())
      assert.matches("watching", tostring(g))
      g:check(("and so on "):rep(9))
      assert.matches("triggered: phrase", tostring(g))
      do
        local h <close> = g -- luacheck: ignore
      end
      assert.is_true(g:closed())
      g:close() -- idempotent
      assert.matches("closed", tostring(g))
      assert.has_error(function() g:feed("x") end, "attempt to use a closed repetition guard")
      assert.has_error(function() return g.rule end, "attempt to use a closed repetition guard")
      local feed = repetition.new().feed
      assert.has_error(function() feed(io.stdout, "x") end)
      assert.has_error(function() feed(repetition.new(), {}) end)
      assert.is_nil(repetition.new().unknown_field)
    end)
  end)

  describe("stage", function()
    local function think(t) return { type = "think", text = t } end
    local function text(t) return { type = "text", text = t } end

    -- A looping source: one line of reasoning, then the same line 200
    -- times (bounded, so a guard that misses the loop fails, not hangs).
    local function looping_source(kind, line)
      local n = 0
      local src = function()
        n = n + 1
        if n == 1 then return { type = kind, text = "Start.\n" } end
        if n <= 201 then return { type = kind, text = line } end
      end
      return src, function() return n end
    end

    it("passes a clean stream through unchanged", function()
      local list = { think("Let me think.\n"), think("Fine.\n"), text("Bonjour !"),
        { type = "progress", completion_tokens = 3 }, { type = "done", finish_reason = "stop" } }
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(list),
        { { name = "repetition", fn = repetition.stage } }))
      assert.same(list, out)
    end)

    it("cuts a looping think channel: on_cut, the chunk, a cut event, then the end", function()
      local src, pulled = looping_source("think", "Wait, let me reconsider.\n")
      local cuts = {}
      local opts = { on_cut = function(info) cuts[#cuts + 1] = info end }
      local out = pipeline.collect(pipeline.compose(src, { { name = "r", fn = repetition.stage, opts = opts } }))
      assert.equal(1, #cuts)
      local last = out[#out]
      assert.same({ type = "cut", reason = "repetition", line = "Wait, let me reconsider.", count = 6,
        channel = "think", rule = "cycle" }, last)
      assert.equal(cuts[1], last)
      assert.equal("think", out[#out - 1].type)
      assert.equal(7, pulled())          -- 1 + 6 lines: nothing read after the cut
      assert.equal(8, #out)
    end)

    it("watches only think by default, text when asked", function()
      local lines = {}
      for i = 1, 10 do lines[i] = text("The answer is the same every time.\n") end
      lines[#lines + 1] = { type = "done" }
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(lines), { repetition.stage }))
      assert.equal(11, #out)
      assert.equal("done", out[11].type)
      local st = { { name = "r", fn = repetition.stage, opts = { channels = { text = true } } } }
      out = pipeline.collect(pipeline.compose(pipeline.from_list(lines), st))
      assert.equal("cut", out[#out].type)
      assert.equal("text", out[#out].channel)
      assert.equal(7, #out)
    end)

    it("gives every channel's guard the thresholds of its options", function()
      local list = {}
      for _ = 1, 3 do
        list[#list + 1] = think("Same sentence in both channels.\n")
        list[#list + 1] = text("Same sentence in both channels.\n")
      end
      local opts = { channels = { think = true, text = true }, repeats = 2, on_cut = function() end }
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(list),
        { { name = "r", fn = repetition.stage, opts = opts } }))
      assert.same({ type = "cut", reason = "repetition", line = "Same sentence in both channels.", count = 2,
        channel = "think", rule = "cycle" }, out[#out]) -- the default (6 in a row) would let all three through
      opts.channels.think = nil -- text alone: its guard has them too
      out = pipeline.collect(pipeline.compose(pipeline.from_list(list),
        { { name = "r", fn = repetition.stage, opts = opts } }))
      assert.equal("text", out[#out].channel)
      assert.equal(2, out[#out].count)
    end)

    it("keeps channels apart: think and text do not add up", function()
      local list = {}
      for _ = 1, 4 do
        list[#list + 1] = think("Same sentence in both channels.\n")
        list[#list + 1] = text("Same sentence in both channels.\n")
      end
      local st = { { name = "r", fn = repetition.stage, opts = { channels = { think = true, text = true } } } }
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(list), st))
      assert.equal(8, #out)
      for _, e in ipairs(out) do assert.not_equal("cut", e.type) end
    end)

    it("cuts a phrase loop streamed as small tokens", function()
      local i = 0
      local words = { "and ", "so ", "on " }
      local src = function()
        if i == 300 then return nil end -- bounded: a missed loop fails, not hangs
        i = i + 1
        return think(words[(i - 1) % 3 + 1])
      end
      local out = pipeline.collect(pipeline.compose(src, { repetition.stage }))
      local cut = out[#out]
      assert.same({ type = "cut", reason = "repetition", line = "and so on", count = 8, channel = "think",
        rule = "phrase" }, cut)
      assert.equal(24, i) -- cut after 24 tokens (8 x "and so on"), nothing read after
      assert.equal(25, #out)
    end)
  end)
end)

-- The incremental guard (issue 12) against the one-string guard it
-- replaced (tests/lua/repetition_ref.lua): the same verdicts, lines,
-- counts, rules, at the same delta, on random texts with loops of every
-- kind, cut into random chunks (UTF-8 characters split too).
describe("mirza.repetition, incremental", function()
  local ref = require "tests.lua.repetition_ref"
  local WORDS = { "the", "answer", "is", "Wait", "let", "me", "check", "vérifier", "encore", "déjà", "x", "=",
    "f(x)", "{", "}", "end", "return", "so", "on", "and", "»", "«", '"', ")", "12", "3.14", "e.g.", "Mr.", "ok",
    "la", "—", "…", "```", "- item", "1.", "café", "naïve", "(", "]" }
  local SEPS = { " ", " ", " ", " ", ". ", "! ", "? ", "... ", "… ", "\n", "\n\n", ".\n", "  ", "\t", ", ", ".) ",
    '." ', " : ", ";" }

  local function phrase(rnd, n)
    local t = {}
    for i = 1, n do t[i] = WORDS[rnd(#WORDS)] .. SEPS[rnd(#SEPS)] end
    return table.concat(t)
  end

  -- Random prose with a loop now and then: a phrase or line repeated.
  local function text(rnd)
    local t = {}
    for _ = 1, rnd(12) do
      t[#t + 1] = phrase(rnd, rnd(30))
      if rnd(3) == 1 then
        local unit = phrase(rnd, rnd(6))
        if rnd(2) == 1 then unit = unit:gsub("%s*$", "") .. (rnd(2) == 1 and "\n" or " ") end
        t[#t + 1] = unit:rep(rnd(40))
      end
    end
    return table.concat(t)
  end

  -- The report (the reference's `count` is its threshold until a rule
  -- triggers: the field's two uses shared a name; the C guard says nil).
  local function verdicts(guard_mod, s, cuts, opts)
    local g, pos = guard_mod.new(opts), 1
    for _, n in ipairs(cuts) do
      local hit, line, count = g:feed(s:sub(pos, pos + n - 1))
      pos = pos + n
      if hit then return { hit, line, count, g.rule, pos } end
      if pos > #s then break end
    end
    local hit, line, count = g:check("")
    return { hit, line, hit and count or nil, g.rule, pos }
  end

  local OPTS = { false, { repeats = 3, count = 4, window = 8, phrase_repeats = 3, phrase_min_chars = 12,
    max_phrase = 10, line_repeats = 5, min_letters = 2 }, { phrase_repeats = 1, phrase_min_chars = 1 } }

  it("gives the reference's verdicts on 240 random texts", function()
    local state = 12345
    local function rnd(n) -- a small LCG: the same texts on every run and platform
      state = (state * 1103515245 + 12345) % 2147483648
      return state % n + 1
    end
    local hits = 0
    for case = 1, 240 do
      local s = text(rnd)
      local cuts, total = {}, 0
      while total < #s do -- every 5th text in one piece: the tail is cut to its bound at once
        local n = case % 5 == 0 and #s or rnd(case % 4 == 0 and 40 or 9)
        cuts[#cuts + 1], total = n, total + n
      end
      local opts = OPTS[case % #OPTS + 1] or nil
      local want, got = verdicts(ref, s, cuts, opts), verdicts(repetition, s, cuts, opts)
      assert.same(want, got, ("case %d: %q"):format(case, s))
      if want[1] then hits = hits + 1 end
    end
    assert.is_true(hits > 40 and hits < 200, "both kinds of texts were drawn: " .. hits .. " hits")
  end)

  it("counts on the bounded tail, like the reference, when one delta overflows it", function()
    for _, s in ipairs { ("and so on "):rep(1000), "Start. " .. ("la la "):rep(900) .. ("Wait.\n"):rep(700) } do
      local g = ref.new()
      local want = { g:check(s) }
      want[4] = g.rule
      assert.same(want, { repetition.new():check(s) })
    end
    -- 3072 / 10 units; the trimmed tail starts mid-word, so the unit does too
    assert.same({ true, "n and so o", 307, "phrase" }, { repetition.new():check(("and so on "):rep(1000)) })
  end)
end)
