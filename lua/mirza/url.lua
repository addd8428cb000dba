--- mirza.url: what URL a request takes, from an endpoint as its user wrote it.
---
--- One rule, for every place that takes an endpoint: mirza.batch
--- (--endpoint), mirza.pool (and so mirza.embed and an engine's
--- `endpoints`), the engine's `base_url` and its probe (mirza.detect), a
--- supervised daemon's URL:
---
---   a bare host: "http://h:8080", "http://h:8080/"     its /v1 ("http://h:8080/v1")
---   a base with a path: "…/v1", "…/api/v1" (OpenRouter), "…/openai/v1" (Groq),
---     "…/v1beta/openai/" (Gemini)                      kept as written (less a last "/")
---   a route's URL: "…/chat/completions", "…/completions", "…/embeddings",
---     "…/models" (Azure's "…/openai/deployments/D/chat/completions")
---                                                      that route; the base is what
---                                                      comes before it, and the other
---                                                      routes are made from that base
---   a query string: "?api-version=2024-10-21"          kept on every request
---
--- Nothing is guessed from the path: a base is never given /v1 because it
--- lacks a version, and the probe (mirza.detect) learns what answers, never
--- where the routes are. Redacting credentials for messages is
--- mirza.redact_url's, not this module's.
local U = {}

---The routes by name (mirza.batch's line kinds), under the base.
U.ROUTES = { chat = "chat/completions", completions = "completions", embeddings = "embeddings", models = "models" }

-- The route suffixes a pasted URL may end with, the longer first
-- ("/chat/completions" before "/completions").
local SUFFIXES = { "/chat/completions", "/completions", "/embeddings", "/models" }

---What URL a request takes. `url` is the endpoint as its user wrote it (a
---bare host, a base with a path, a route's URL; a query string kept, a
---fragment dropped); `route` is a route's name (`chat`, `completions`,
---`embeddings`, `models`: under the base), a path from the server's root
---("/health", "/props", "/admin/cache/clear": under the base less a last
---"/v<N>"), or nil (the base itself). The query string goes on every URL
---this returns.
---@param url string
---@param route? string
---@return string request the URL the request takes (route nil: the base, its query kept)
---@return string base the base URL: no route, no query, no last "/" ("http://h:8080/v1")
---@return boolean bare the URL was a bare host: /v1 was added
function U.resolve(url, route)
  local base, query = url:match("^([^?#]*)(%??[^#]*)")
  if query == "?" then query = "" end
  base = base:gsub("/+$", "")
  local bare = not (base:match("^%a[%w+.-]*://(.*)$") or base):find("/", 1, true) -- no path after the host
  if bare then
    base = base .. "/v1"
  else
    for _, r in ipairs(SUFFIXES) do
      if base:sub(-#r) == r then
        base = base:sub(1, -#r - 1)
        break
      end
    end
  end
  if route == nil then return base .. query, base, bare end
  if route:sub(1, 1) == "/" then return base:gsub("/v%d+$", "") .. route .. query, base, bare end
  return base .. "/" .. (U.ROUTES[route] or route) .. query, base, bare
end

return U
