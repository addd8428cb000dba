-- mirza.route: sentence splitting (French and English), delivery modes,
-- think/answer/error sinks, the <think> inline rendering.
local route = require "mirza.route"
local pipeline = require "mirza.pipeline"
local H = require "tests.helper"

local NBSP, NNBSP = "\194\160", "\226\128\175"

local function think(t) return { type = "think", text = t } end
local function text(t) return { type = "text", text = t } end
local DONE = { type = "done", finish_reason = "stop", usage = { completion_tokens = 9 } }

-- Feed `s` to a splitter in pieces of `size` bytes; all sentences.
local function split_by(s, size)
  local sp, out = route.splitter(), {}
  for i = 1, #s, size do
    for _, x in ipairs(sp:push(s:sub(i, i + size - 1))) do out[#out + 1] = x end
  end
  for _, x in ipairs(sp:flush()) do out[#out + 1] = x end
  return out
end

-- The split must not depend on how the text was chunked.
local function assert_split(s, expected)
  assert.same(expected, route.split(s), s)
  for _, size in ipairs({ 1, 2, 3, 7 }) do
    assert.same(expected, split_by(s, size), ("chunks of %d: %s"):format(size, s))
  end
end

describe("mirza.route", function()
  after_each(function() collectgarbage("collect") end)

  describe("sentence splitter, English", function()
    local cases = {
      { "Hello there. How are you? I'm fine!", { "Hello there.", "How are you?", "I'm fine!" } },
      { "Mr. Smith met Dr. Jones at St. Paul's. They talked.",
        { "Mr. Smith met Dr. Jones at St. Paul's.", "They talked." } },
      { "Mrs. Brown arrived. She sat down.", { "Mrs. Brown arrived.", "She sat down." } },
      { "Bring fruit, e.g. apples or pears. Also bread.", { "Bring fruit, e.g. apples or pears.", "Also bread." } },
      { "Use a solvent, i.e. Water. Then stir.", { "Use a solvent, i.e. Water.", "Then stir." } },
      { "We bought apples, pears, etc. Then we left.", { "We bought apples, pears, etc.", "Then we left." } },
      { "Apples, pears, etc. are fruit.", { "Apples, pears, etc. are fruit." } },
      { "Pi is about 3.14. That is enough.", { "Pi is about 3.14.", "That is enough." } },
      { "It costs 1,000.5 dollars. Cheap!", { "It costs 1,000.5 dollars.", "Cheap!" } },
      { "The answer is 12. Next question.", { "The answer is 12.", "Next question." } },
      { "Well... I think so. Maybe.", { "Well...", "I think so.", "Maybe." } },
      { "He paused... Then he spoke.", { "He paused...", "Then he spoke." } },
      { "Well... maybe not.", { "Well... maybe not." } },
      { "Wait\226\128\166 Really? Yes.", { "Wait\226\128\166", "Really?", "Yes." } },
      { 'He said "Stop." Then he left.', { 'He said "Stop."', "Then he left." } },
      { "(This is an aside.) Back to the point.", { "(This is an aside.)", "Back to the point." } },
      { "\226\128\156Really?\226\128\157 she asked. \226\128\156Yes.\226\128\157 He nodded.",
        { "\226\128\156Really?\226\128\157 she asked.", "\226\128\156Yes.\226\128\157", "He nodded." } },
      { "What?! No way!!! Okay.", { "What?!", "No way!!!", "Okay." } },
      { "J. R. R. Tolkien wrote it. Read it.", { "J. R. R. Tolkien wrote it.", "Read it." } },
      { "Real Madrid vs. Barcelona tonight. Exciting.", { "Real Madrid vs. Barcelona tonight.", "Exciting." } },
      { "See cf. Chapter 2 for details. Done.", { "See cf. Chapter 2 for details.", "Done." } },
      { "The U.S. Army left. Fine.", { "The U.S. Army left.", "Fine." } },
      { "In 1999. 2000 came next.", { "In 1999.", "2000 came next." } },
      { "Version 2.0.1 is out. Update now.", { "Version 2.0.1 is out.", "Update now." } },
      { "Steps:\n1. Open the lid.\n2. Pour the water.\n3. Close it.",
        { "Steps:", "1. Open the lid.", "2. Pour the water.", "3. Close it." } },
      { "- first item\n- second item\n\nParagraph two.", { "- first item", "- second item", "Paragraph two." } },
      { "No terminator at the end", { "No terminator at the end" } },
      { "Tell me. Then go.", { "Tell me.", "Then go." } },
      { "", {} },
      { "   \n\n  ", {} },
    }
    for _, c in ipairs(cases) do
      it(("splits %q"):format(c[1]), function() assert_split(c[1], c[2]) end)
    end
  end)

  describe("sentence splitter, French", function()
    local cases = {
      { "Bonjour ! Comment ça va ? Très bien.", { "Bonjour !", "Comment ça va ?", "Très bien." } },
      { "Bonjour" .. NNBSP .. "! Ça va" .. NNBSP .. "? Oui.",
        { "Bonjour" .. NNBSP .. "!", "Ça va" .. NNBSP .. "?", "Oui." } },
      { "Attention : il pleut ; prenez un parapluie. Merci.",
        { "Attention : il pleut ; prenez un parapluie.", "Merci." } },
      { "M. Dupont est arrivé. Mme. Durand aussi.", { "M. Dupont est arrivé.", "Mme. Durand aussi." } },
      { "Mme Curie et M. Martin sont là. Entrez.", { "Mme Curie et M. Martin sont là.", "Entrez." } },
      { "Des fruits, p. ex. des pommes. Et du pain.", { "Des fruits, p. ex. des pommes.", "Et du pain." } },
      { "Voir cf. Annexe 2. Fin.", { "Voir cf. Annexe 2.", "Fin." } },
      -- a known limit: a lone capital before a dot reads as an initial
      { "Voir le plan B. Fin.", { "Voir le plan B. Fin." } },
      { "Il a dit : « Viens ! » Puis il est parti.", { "Il a dit : « Viens ! »", "Puis il est parti." } },
      { "« Viens ! » dit-il. Elle vint.", { "« Viens ! » dit-il.", "Elle vint." } },
      { "«" .. NBSP .. "Où es-tu" .. NBSP .. "?" .. NBSP .. "» demanda-t-elle. Silence.",
        { "«" .. NBSP .. "Où es-tu" .. NBSP .. "?" .. NBSP .. "» demanda-t-elle.", "Silence." } },
      { "Eh bien… je ne sais pas. Peut-être… Oui, sûrement.",
        { "Eh bien… je ne sais pas.", "Peut-être…", "Oui, sûrement." } },
      { "Il coûte 3,50 €. C'est cher.", { "Il coûte 3,50 €.", "C'est cher." } },
      { "Le 12. arrondissement ? Non, le 13e.", { "Le 12. arrondissement ?", "Non, le 13e." } },
      { "Pommes, poires, etc. Ensuite, le fromage.", { "Pommes, poires, etc.", "Ensuite, le fromage." } },
      { "Il est parti. À demain ! Élodie reste.", { "Il est parti.", "À demain !", "Élodie reste." } },
      -- a "." and a space end a sentence whatever comes next: it is handed over at the space (issue 36)
      { "C'est fini. écoute bien.", { "C'est fini.", "écoute bien." } },
      { "Des pommes, etc. et du pain. Fin.", { "Des pommes, etc. et du pain.", "Fin." } },
      { "« Il pleut. Viens ! » Elle vint.", { "« Il pleut.", "Viens ! »", "Elle vint." } },
      { "Ah ? oui. Bon !", { "Ah ?", "oui.", "Bon !" } },
      { "Quoi ?! Vraiment ? Oui…", { "Quoi ?!", "Vraiment ?", "Oui…" } },
      { "Étape 1 : chauffer.\n2. Verser le lait.", { "Étape 1 : chauffer.", "2. Verser le lait." } },
    }
    for _, c in ipairs(cases) do
      it(("splits %q"):format(c[1]), function() assert_split(c[1], c[2]) end)
    end

    it("accepts extra abbreviations", function()
      local sp = route.splitter({ abbreviations = { Bd = true } })
      local out = sp:push("Il habite 5 Bd. Voltaire. Au fond. ")
      assert.same({ "Il habite 5 Bd. Voltaire.", "Au fond." }, out)
      assert.same({}, sp:flush())
      assert.same({ "Il habite 5 Bd.", "Voltaire.", "Au fond." }, route.split("Il habite 5 Bd. Voltaire. Au fond."))
    end)

    -- Issue 36: the end is handed over as soon as it is seen (a delta
    -- ending in ". "), not one delta later; only where the next word's
    -- case decides (an ellipsis, "etc.", a number, a » that may follow)
    -- is the sentence held back until that word comes.
    it("hands a sentence over when its space is seen; holds it where the next word decides", function()
      local sp = route.splitter()
      assert.same({}, sp:push("Mr."))
      assert.same({}, sp:push(" ")) -- an abbreviation: never an end
      assert.same({}, sp:push("Smith left."))
      assert.same({ "Mr. Smith left." }, sp:push(" "))
      assert.same({ "How are you?" }, sp:push("How are you? "))
      assert.same({ "Fine!" }, sp:push("Fine!	"))
      assert.same({}, sp:push("Well... "))
      assert.same({ "Well..." }, sp:push("He"))
      assert.same({}, sp:push(" paid 12. "))
      assert.same({ "He paid 12." }, sp:push("Then"))
      assert.same({}, sp:push(" apples, etc. "))
      assert.same({ "Then apples, etc. and pears." }, sp:push("and pears. ")) -- "etc. and" goes on
      assert.same({}, sp:flush())
      local fr = route.splitter()
      assert.same({}, fr:push("« Viens ! ")) -- a » may follow
      assert.same({}, fr:push("» ")) -- after closing marks the next word decides (« Viens ! » dit-il)
      assert.same({ "« Viens ! » dit-il." }, fr:push("dit-il. "))
    end)
  end)

  describe("router", function()
    local function run(events, opts)
      local got = { answer = {}, think = {}, error = {}, other = {} }
      opts = opts or {}
      opts.answer = opts.answer or function(t) got.answer[#got.answer + 1] = t end
      opts.think = opts.think or function(t) got.think[#got.think + 1] = t end
      opts.error = opts.error or function(m, ev) got.error[#got.error + 1] = { m, ev.code } end
      opts.on_event = function(ev) got.other[#got.other + 1] = ev.type end
      local res = route.run(pipeline.from_list(events), opts)
      return got, res
    end

    local STREAM = { think("The user "), think("greets me."), { type = "progress", completion_tokens = 4 },
      text("Bonjour ! "), text("Je vais"), text(" bien. Et"), text(" vous ?"), DONE }

    it("token mode: every delta, think apart", function()
      local got, res = run(STREAM, { mode = "token" })
      assert.same({ "Bonjour ! ", "Je vais", " bien. Et", " vous ?" }, got.answer)
      assert.same({ "The user ", "greets me." }, got.think)
      assert.same({ "progress", "done" }, got.other)
      assert.equal("Bonjour ! Je vais bien. Et vous ?", res.answer)
      assert.equal("The user greets me.", res.think)
      assert.equal("stop", res.finish_reason)
      assert.same({ completion_tokens = 9 }, res.usage)
      assert.same({}, got.error)
    end)

    it("sentence mode: complete sentences, the rest flushed at done", function()
      local got = run(STREAM, { mode = "sentence" })
      assert.same({ "Bonjour !", "Je vais bien.", "Et vous ?" }, got.answer)
    end)

    it("sentence mode: a sentence reaches the sink with the delta that ends it (issue 36)", function()
      local got = {}
      local r = route.router { answer = function(t) got[#got + 1] = t end }
      r:feed(text("Bonjour"))
      r:feed(text(" ! ")) -- the end is seen: not held for the next word
      assert.same({ "Bonjour !" }, got)
      r:feed(text("Ça va"))
      r:feed(text(" bien. "))
      assert.same({ "Bonjour !", "Ça va bien." }, got)
      r:feed(text("Et vous"))
      r:feed(DONE)
      assert.same({ "Bonjour !", "Ça va bien.", "Et vous" }, got)
    end)

    it("sentence mode is the default", function()
      local got = run({ text("One. Two"), DONE })
      assert.same({ "One.", "Two" }, got.answer)
    end)

    it("whole mode: once, at done; think whole once the answer starts", function()
      local order = {}
      local got = run(STREAM, {
        mode = "whole", think_mode = "whole",
        answer = function(t) order[#order + 1] = "answer:" .. t end,
        think = function(t) order[#order + 1] = "think:" .. t end,
      })
      assert.same({ "think:The user greets me.", "answer:Bonjour ! Je vais bien. Et vous ?" }, order)
      assert.same({}, got.error)
    end)

    it("think_mode sentence: the thinking by sentence, ended when the answer starts", function()
      local got = run({ think("First I greet. Then I"), think(" answer"), text("Salut."), DONE },
        { think_mode = "sentence", mode = "token" })
      assert.same({ "First I greet.", "Then I answer" }, got.think)
      assert.same({ "Salut." }, got.answer)
    end)

    it("sinks can be objects with write", function()
      local a, t = route.buffer(), route.buffer()
      route.run(pipeline.from_list(STREAM), { answer = a, think = t, mode = "token" })
      assert.equal("Bonjour ! Je vais bien. Et vous ?", a:text())
      assert.equal("The user greets me.", t:text())
      assert.has_error(function() route.sink(42) end,
        "route: a sink is a function, a file handle or an object with a write method, not a number")
      assert.has_error(function() route.router({ mode = "paragraph" }) end,
        'route: unknown mode "paragraph" (token, sentence, whole)')
    end)

    -- What a file holds once `fn(f)` wrote to it.
    local written = H.written

    it("a C function (io.write, print) gets the text only", function()
      local out = written(function(f)
        local old = io.output()
        io.output(f)
        local ok, err = pcall(route.run, pipeline.from_list(STREAM),
          { answer = io.write, think = io.write, mode = "token" })
        io.output(old)
        assert(ok, err)
      end)
      assert.equal("The user greets me.Bonjour ! Je vais bien. Et vous ?", out)
    end)

    it("a Lua function gets the text and its event", function()
      local got = {}
      route.run(pipeline.from_list(STREAM), { answer = function(t, ev) got[#got + 1] = { t, ev.type } end })
      assert.same({ { "Bonjour !", "text" }, { "Je vais bien.", "text" }, { "Et vous ?", "done" } }, got)
    end)

    it("a file handle is written with :write, the error sink a line per error", function()
      local err = { type = "error", code = "closed", message = "cut short" }
      local out = written(function(f)
        route.run(pipeline.from_list({ think("Hmm. "), text("Un. Deux"), err }), { answer = f, think = f, error = f })
      end)
      assert.equal("Hmm. Un.Deuxcut short\n", out)
      local closed = assert(io.tmpfile())
      closed:close()
      assert.has_error(function() route.router({ answer = closed }) end,
        "route: the sink is a closed file: open it again, or pass another sink")
    end)

    for _, mode in ipairs({ "token", "sentence", "whole" }) do
      it(mode .. " mode: an error goes to the error sink, never into the answer", function()
        local err = { type = "error", code = "server", message = "model owner made no progress for 300s" }
        local got, res = run({ think("Hmm."), text("La réponse est "), text("quarante"), err }, { mode = mode })
        assert.same({ { "model owner made no progress for 300s", "server" } }, got.error)
        local spoken = table.concat(got.answer, "|")
        assert.is_nil(spoken:find("progress", 1, true))
        assert.equal("La réponse est quarante", res.answer) -- the partial answer is kept
        assert.equal(err, res.error)
        if mode == "token" then assert.same({ "La réponse est ", "quarante" }, got.answer)
        else assert.same({ "La réponse est quarante" }, got.answer) end
      end)
    end

    it("flush_on_error=false keeps a half sentence from being spoken", function()
      local got, res = run({ text("Done. Half a sen"), { type = "error", code = "closed", message = "cut" } },
        { mode = "sentence", flush_on_error = false })
      assert.same({ "Done." }, got.answer)
      assert.equal("Done. Half a sen", res.answer)
      assert.same({ { "cut", "closed" } }, got.error)
    end)

    it("a cut event ends the turn and flushes", function()
      local cut = { type = "cut", reason = "repetition", line = "Wait.", count = 6, channel = "think" }
      local got, res = run({ think("Wait. "), text("Partial answer"), cut, text("never") }, { mode = "sentence" })
      assert.same({ "Partial answer" }, got.answer)
      assert.equal(cut, res.cut)
      assert.same({ "cut" }, got.other)
      assert.equal("Partial answer", res.answer)
    end)

    it("an iterator that ends without a terminal event still flushes", function()
      local got, res = run({ text("Un. Deux") }, { mode = "sentence" })
      assert.same({ "Un.", "Deux" }, got.answer)
      assert.is_true(res.ended)
      assert.is_nil(res.finish_reason)
    end)

    it("works as a pass-through pipeline stage", function()
      local a = route.buffer()
      local st = { { name = "route", fn = route.stage, opts = { answer = a, mode = "sentence" } } }
      local out = pipeline.collect(pipeline.compose(pipeline.from_list(STREAM), st))
      assert.same(STREAM, out)
      assert.same({ "Bonjour !", "Je vais bien.", "Et vous ?" }, a.parts)
    end)

    it("the default error sink writes to stderr, not to the answer", function()
      local real = io.stderr
      local captured = {}
      io.stderr = { write = function(_, s) captured[#captured + 1] = s end } -- luacheck: ignore
      local evs = { text("Hi."), { type = "error", code = "refused", message = "no daemon" } }
      local ok, e = pcall(route.run, pipeline.from_list(evs),
        { answer = function() end })
      io.stderr = real -- luacheck: ignore
      assert.is_true(ok, e)
      assert.same({ "mirza: refused error: no daemon\n" }, captured)
    end)
  end)

  describe("inline rendering", function()
    local function render(events, opts)
      return pipeline.collect(route.inline(pipeline.from_list(events), opts))
    end

    it("wraps the thinking in <think> tags before the answer", function()
      assert.same({ "<think>", "The user ", "greets me.", "</think>", "Bonjour", " !" },
        render({ think("The user "), think("greets me."), { type = "progress" }, text("Bonjour"), text(" !"), DONE }))
    end)

    it("closes an open think at the end, at a cut, and without an answer", function()
      assert.same({ "<think>", "a", "</think>" }, render({ think("a") }))
      assert.same({ "<think>", "a", "</think>" }, render({ think("a"), { type = "cut", line = "a" } }))
      assert.same({ "answer only" }, render({ text("answer only"), DONE }))
    end)

    it("sends errors to the error sink, not inline", function()
      local errs = {}
      local out = render({ think("x"), text("partial"), { type = "error", code = "http", message = "HTTP 500" } },
        { error = function(m, ev) errs[#errs + 1] = ev.code .. ":" .. m end })
      assert.same({ "<think>", "x", "</think>", "partial" }, out)
      assert.same({ "http:HTTP 500" }, errs)
      errs = {}
      out = render({ think("y"), { type = "error", code = "timeout", message = "stall" } },
        { error = function(m) errs[#errs + 1] = m end })
      assert.same({ "<think>", "y", "</think>" }, out)
      assert.same({ "stall" }, errs)
    end)
  end)
end)

describe("mirza.route splitter: FR/EN abbreviations", function()
  it("does not end a sentence after p., pp., no., art., M., Mr., Dr., e.g., i.e.", function()
    assert.same({ "Voir p. 12 et pp. 30-31 du no. 4, art. 5 du code.", "Fin." },
      route.split("Voir p. 12 et pp. 30-31 du no. 4, art. 5 du code. Fin."))
    assert.same({ "M. Dupont et Mr. Smith ont vu Dr. Who.", "Ensuite ?" },
      route.split("M. Dupont et Mr. Smith ont vu Dr. Who. Ensuite ?"))
    assert.same({ "Fruits, e.g. Apples, i.e. Red ones, etc. are fine.", "Next." },
      route.split("Fruits, e.g. Apples, i.e. Red ones, etc. are fine. Next."))
  end)
  it("still ends a sentence after etc. before a capital", function()
    assert.same({ "Des pommes, des poires, etc.", "Puis le reste." },
      route.split("Des pommes, des poires, etc. Puis le reste."))
  end)

  -- The splitter scans incrementally (issue 12): a delta without a
  -- terminator is only appended, a scan resumes where the last stopped.
  -- Whatever the chunking, random French and English text (with « », "…",
  -- abbreviations, numbers and UTF-8 characters cut between deltas) splits
  -- as the whole text does.
  it("splits random texts the same whatever the chunks", function()
    local bits = { "Bonjour", "le", "Mr.", "M.", "e.g.", "3.14", "12.", "…", "...", "!", "?", ".", "\n", " ", " ",
      "  ", "«\194\160", "\194\160»", "”", "’", ")", '"', "Été", "élan", "Il", "dit", "x", "J.", "R.", "U.S.", "—" }
    local state = 777
    local function rnd(n)
      state = (state * 1103515245 + 12345) % 2147483648
      return state % n + 1
    end
    for case = 1, 150 do
      local t = {}
      for i = 1, rnd(80) do t[i] = bits[rnd(#bits)] .. (rnd(3) == 1 and "" or " ") end
      local str = table.concat(t)
      local whole = route.split(str)
      for _, size in ipairs { 1, 2, rnd(9) } do
        assert.same(whole, split_by(str, size), ("case %d, chunks of %d: %q"):format(case, size, str))
      end
    end
  end)
end)
