--- mirza.thinking: the thinking (reasoning) policy of a turn.
---
--- The seed keeps a reasoning budget in tokens on the steps (0, 512, 1024,
--- 2048): 0 is off, the others are the daemon's three effort levels. The
--- state is a plain table owned by the engine (`thinking.state()`); every
--- function here takes it, so the module can be hot-reloaded.
---
--- Budget → level: a budget is never snapped when stored (llama-server takes
--- the exact `thinking_budget_tokens`), but the effort level is the smallest
--- step >= the budget, so a level never gives less room than was asked for:
--- 1..512 → low, 513..1024 → medium, > 1024 → high.
local M = {}

--- The seed's budget steps, in tokens.
M.STEPS = { 0, 512, 1024, 2048 }
--- Budget given by `set_thinking(state, true)`.
M.DEFAULT_BUDGET = 1024
--- Level name of each step.
M.LEVELS = { [0] = "off", [512] = "low", [1024] = "medium", [2048] = "high" }
--- `reasoning_effort` values every MTPLX version accepts (2.5.2: auto|low|
--- medium|high; 2.12: low|medium|high|xhigh; anything else is an HTTP 500).
M.SAFE_EFFORTS = { low = true, medium = true, high = true }

---@class mirza.ThinkingState
---@field budget integer          reasoning budget in tokens (0: off)
---@field decide? fun(prompt_text: string, state: mirza.ThinkingState): integer  per-turn hook
---@field efforts? table<string, boolean>  reasoning_effort values the daemon accepts

---A new thinking state.
---@param budget? integer initial budget (default 0: off)
---@return mirza.ThinkingState
function M.state(budget)
  local s = { budget = 0 }
  M.set_budget(s, budget or 0)
  return s
end

---Set the budget, clamped at 0 (not snapped: see the module comment).
---@param state mirza.ThinkingState
---@param budget number
---@return integer budget the stored budget
function M.set_budget(state, budget)
  if type(budget) ~= "number" then error("thinking.set_budget: budget must be a number", 2) end
  state.budget = math.max(0, math.floor(budget))
  return state.budget
end

---The seed's setThinkingMode: on = DEFAULT_BUDGET, off = 0.
---@param state mirza.ThinkingState
---@param on boolean
---@return integer budget
function M.set_thinking(state, on)
  return M.set_budget(state, on and M.DEFAULT_BUDGET or 0)
end

---Thinking is on when the budget is positive.
---@param state mirza.ThinkingState
---@return boolean
function M.enabled(state)
  return state.budget > 0
end

---The step a budget maps to: the smallest step >= budget, capped at the top.
---@param budget integer
---@return integer step one of STEPS
function M.step(budget)
  for _, s in ipairs(M.STEPS) do
    if budget <= s then return s end
  end
  return M.STEPS[#M.STEPS]
end

---Level name of a budget: "off", "low", "medium" or "high".
---@param budget integer
---@return string
function M.level(budget)
  return M.LEVELS[M.step(math.max(0, budget))]
end

---The seed's reasoningEffortFor: the `reasoning_effort` for a budget, nil
---when thinking is off.
---@param budget integer
---@return string|nil
function M.effort(budget)
  local l = M.level(budget)
  if l == "off" then return nil end
  return l
end

---The seed's resolveMaxTokens. A thinking turn spends its reasoning out of
---the same completion budget (`completion_tokens` includes reasoning), so it
---gets `max_tokens_thinking` when set, else `max_tokens + budget`. A plain
---turn gets `max_tokens`. nil stays nil (the daemon's default).
---@param state mirza.ThinkingState
---@param max_tokens integer|nil
---@param max_tokens_thinking integer|nil
---@return integer|nil
function M.max_tokens(state, max_tokens, max_tokens_thinking)
  if not M.enabled(state) then return max_tokens end
  if max_tokens_thinking then return max_tokens_thinking end
  if max_tokens then return max_tokens + state.budget end
  return nil
end

local dialects = {}

-- MTPLX: top-level enable_thinking, and reasoning_effort only when thinking
-- and only a value the daemon accepts (else it answers 500).
function dialects.mtplx(state, budget)
  local f = { enable_thinking = budget > 0 }
  local effort = M.effort(budget)
  if effort and (state.efforts or M.SAFE_EFFORTS)[effort] then f.reasoning_effort = effort end
  return f
end

-- llama-server ignores the top-level fields: thinking is switched in the chat
-- template, and the budget is a real token cap.
function dialects.llama(_, budget)
  local f = { chat_template_kwargs = { enable_thinking = budget > 0 } }
  if budget > 0 then f.thinking_budget_tokens = budget end
  return f
end

-- Plain OpenAI-compatible (OpenAI, Ollama, any other): OpenAI's own
-- `reasoning_effort` (low/medium/high) when thinking, and nothing when
-- not — a model without reasoning refuses the field, an older one refuses
-- "none", and Ollama checks the value: off is the server's default.
function dialects.openai(state, budget)
  local effort = M.effort(budget)
  if effort and (state.efforts or M.SAFE_EFFORTS)[effort] then return { reasoning_effort = effort } end
  return {}
end

---Request body fields for the thinking setting.
---"mtplx": `enable_thinking`, `reasoning_effort`; "llama":
---`chat_template_kwargs.enable_thinking`, `thinking_budget_tokens`;
---"openai": `reasoning_effort` when thinking, nothing when not.
---@param state mirza.ThinkingState
---@param dialect "mtplx"|"llama"|"openai"
---@param budget? integer this turn's budget (default state.budget)
---@return table fields to merge into the request body
function M.request_fields(state, dialect, budget)
  local f = dialects[dialect]
  if not f then error(("thinking.request_fields: unknown dialect %q"):format(tostring(dialect)), 2) end
  return f(state, budget or state.budget)
end

---Per-turn hook: the budget for this prompt. Calls `state.decide` when the
---engine or a script set one (clamped at 0, errors propagate to the
---caller, which reports them), else keeps `state.budget`. Does not change
---the state.
---@param prompt_text string the current user message
---@param state mirza.ThinkingState
---@return integer budget
function M.decide(prompt_text, state)
  if not state.decide then return state.budget end
  local b = state.decide(prompt_text, state)
  if type(b) ~= "number" then error("thinking: decide hook must return a number", 2) end
  return math.max(0, math.floor(b))
end

-- Words that usually call for reasoning (English and French).
local HARD = { "why", "how", "prove", "explain", "calculate", "compute", "solve", "step by step",
  "pourquoi", "comment", "démontre", "explique", "calcule", "résous", "étape par étape" }

---A sample `decide` hook: greetings and short chit-chat get no thinking, a
---prompt with maths or a "why/how" word gets at least `medium`, anything
---else keeps the state's budget. Install with `state.decide = thinking.auto`.
---@param prompt_text string
---@param state mirza.ThinkingState
---@return integer budget
function M.auto(prompt_text, state)
  local p = prompt_text:lower()
  local padded = " " .. p:gsub("[%p%s]+", " ") .. " " -- whole words only
  for _, w in ipairs(HARD) do
    if padded:find(" " .. w .. " ", 1, true) then return math.max(state.budget, 1024) end
  end
  if p:find("%d%s*[%+%-%*/^=]%s*%d") then return math.max(state.budget, 1024) end
  local words = select(2, p:gsub("%S+", ""))
  if words <= 4 then return 0 end
  return state.budget
end

---Everything a turn needs from the policy at once.
---@param state mirza.ThinkingState
---@param prompt_text string
---@param dialect "mtplx"|"llama"|"openai"
---@param limits? {max_tokens?: integer, max_tokens_thinking?: integer}
---@param budget? integer this turn's budget, overriding the state and the decide hook
---@return {budget: integer, fields: table, max_tokens: integer|nil}
function M.plan(state, prompt_text, dialect, limits, budget)
  limits = limits or {}
  if budget ~= nil then
    if type(budget) ~= "number" then error("thinking.plan: budget must be a number", 2) end
    budget = math.max(0, math.floor(budget))
  else
    budget = M.decide(prompt_text, state)
  end
  local turn = { budget = budget, efforts = state.efforts }
  return {
    budget = budget,
    fields = M.request_fields(turn, dialect),
    max_tokens = M.max_tokens(turn, limits.max_tokens, limits.max_tokens_thinking),
  }
end

return M
