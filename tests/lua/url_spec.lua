-- mirza.url: what URL a request takes (issue 38 item 3), over docs/batch.md's
-- table of the forms users paste (a bare host, host:port, .../v1, Ollama,
-- OpenRouter, Groq, Gemini, Azure with its api-version, a route's URL) and
-- the request path each gives: the table is read from the page, so what it
-- says is what the rule does. The integration spec (url_forms_spec) sends
-- the http:// forms through batch, a pool and the engine.
local url = require "mirza.url"
local H = require "tests.helper"

-- The rows of the table under "## Endpoints and keys": {given, base, chat, embeddings}
-- (each cell's first `code`).
local function doc_rows()
  local text = H.read_file(H.source .. "/docs/batch.md")
  local section = assert(text:match("\n## Endpoints and keys\n(.-)\n## "), "docs/batch.md: no 'Endpoints and keys'")
  local rows = {}
  for line in section:gmatch("[^\n]+") do
    if line:find("^| `") then
      local cells = {}
      for cell in line:gmatch("|([^|]+)") do cells[#cells + 1] = cell:match("`([^`]+)`") end
      rows[#rows + 1] = cells
    end
  end
  return rows
end

-- A URL's path and query: what the server's request line shows.
local function path_of(u)
  return (u:gsub("^%a[%w+.-]*://[^/?#]*", ""))
end

describe("mirza.url.resolve", function()
  it("gives each form of docs/batch.md's table its base and request paths", function()
    local rows = doc_rows()
    assert.is_true(#rows >= 11, "the table's rows: " .. #rows)
    for _, r in ipairs(rows) do
      local given, base, chat, emb = r[1], r[2], r[3], r[4]
      local got, b = url.resolve(given, "chat")
      assert.equal(base, b, given)
      assert.equal(chat, path_of(got), given)
      assert.equal(emb, path_of((url.resolve(given, "embeddings"))), given)
    end
  end)

  it("makes the Azure deployment's URL exactly what was pasted, and every other route keeps the query", function()
    local azure = "https://R.openai.azure.com/openai/deployments/D/chat/completions?api-version=2024-10-21"
    assert.equal(azure, (url.resolve(azure, "chat")))
    assert.equal("https://R.openai.azure.com/openai/deployments/D/models?api-version=2024-10-21",
      (url.resolve(azure, "models")))
    assert.equal("https://R.openai.azure.com/openai/deployments/D/completions?api-version=2024-10-21",
      (url.resolve(azure, "completions")))
  end)

  it("gives the base (its query kept) without a route, and says when /v1 was added", function()
    assert.same({ "http://h:8080/v1", "http://h:8080/v1", true }, { url.resolve("http://h:8080/") })
    assert.same({ "http://h:8080/api", "http://h:8080/api", false }, { url.resolve("http://h:8080/api") })
    assert.same({ "https://x/openai/deployments/D?api-version=V", "https://x/openai/deployments/D", false },
      { url.resolve("https://x/openai/deployments/D/chat/completions?api-version=V") })
    assert.same({ "http://h:1/v1?k=1", "http://h:1/v1", true }, { url.resolve("http://h:1?k=1#frag") })
  end)

  it("puts a path from the server's root under the base less its /v<N>, the query kept", function()
    assert.equal("http://h:8080/health", (url.resolve("http://h:8080", "/health")))
    assert.equal("http://h:8080/health", (url.resolve("http://h:8080/v1/", "/health")))
    assert.equal("https://openrouter.ai/api/props", (url.resolve("https://openrouter.ai/api/v1", "/props")))
    assert.equal("https://x/openai/deployments/D/health?api-version=V",
      (url.resolve("https://x/openai/deployments/D/chat/completions?api-version=V", "/health")))
  end)

  it("takes the host as the user wrote it: userinfo, IPv6, no scheme", function()
    assert.equal("http://u:p@h:1/v1/chat/completions", (url.resolve("http://u:p@h:1", "chat")))
    assert.equal("http://[::1]:8080/v1/models", (url.resolve("http://[::1]:8080", "models")))
    assert.equal("h:8080/v1/embeddings", (url.resolve("h:8080", "embeddings")))
    assert.equal("h:8080/v1/embeddings", (url.resolve("h:8080/v1", "embeddings")))
  end)
end)
