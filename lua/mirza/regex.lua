--- mirza.regex: the part of ECMA-262 regex (JSON Schema's `pattern`) that
--- a Lua pattern says exactly, translated; anything else refused, never
--- approximated (mirza.schema then leaves that pattern unchecked).
---
--- The subset: literals (a non-ASCII one is its whole UTF-8 sequence), `.`,
--- the classes `\d \w \s` and their negations, `[...]` sets of ASCII
--- members (ranges, escapes, `^` negation), the quantifiers `* + ? {n}
--- {n,} {n,m}` (m <= 100) on one ASCII atom, a leading `^` and a trailing
--- `$`. Refused: groups, `|`, lookarounds, back-references, `\b`, lazy
--- quantifiers, a quantifier on a multi-byte literal, a non-ASCII set
--- member, POSIX-looking `[[`. Both sides search (unanchored unless `^`/`$`
--- say), and Lua's single-character repetitions backtrack, so a match is a
--- match in both. Lua matches bytes where the regex matches code points,
--- and ECMA's `\s` takes Unicode spaces: a translation holding `.`, a
--- negated class or `\s` is flagged byte-wise, for the caller not to apply
--- it to a non-ASCII string.
local M = {}

-- ECMA class escapes -> Lua, outside and inside a set.
local CLASS = { d = "%d", D = "%D", w = "[%w_]", W = "[^%w_]", s = "%s", S = "%S" }
local IN_SET = { d = "%d", w = "%w_", s = "%s" }
local LITERAL_ESCAPES = { n = "\n", t = "\t", r = "\r", f = "\f", v = "\v" }

local function lua_literal(ch)
  return ch:find("^[%^%$%(%)%%%.%[%]%*%+%-%?]$") and "%" .. ch or ch
end

-- One set "[...]" starting at i (the "["): its Lua form, the index
-- after it and whether it is byte-wise (negated, or holding \s, which
-- ECMA extends to Unicode spaces); nil when it uses what cannot be
-- translated (a non-ASCII member: Lua's set would hold its bytes).
local function translate_set(p, i)
  local out, j, bytewise = { "[" }, i + 1, false
  if p:sub(j, j) == "^" then out[2], j, bytewise = "^", j + 1, true end
  local first = true
  while j <= #p do
    local ch = p:sub(j, j)
    if ch == "]" and not first then
      out[#out + 1] = "]"
      return table.concat(out), j + 1, bytewise
    elseif ch:byte() >= 0x80 then return nil
    elseif ch == "\\" then
      local e = p:sub(j + 1, j + 1)
      bytewise = bytewise or e == "s"
      if IN_SET[e] then out[#out + 1] = IN_SET[e]
      elseif LITERAL_ESCAPES[e] then out[#out + 1] = LITERAL_ESCAPES[e]
      elseif e:find("^%p$") then out[#out + 1] = "%" .. e
      else return nil end
      j = j + 2
    elseif ch == "[" then return nil -- ECMA allows it literally, Lua's [[:x:]] would differ
    else
      out[#out + 1] = (ch == "%" or ch == "]") and "%" .. ch or ch
      j = j + 1
    end
    first = false
  end
  return nil -- no closing "]"
end

-- One atom at i: its Lua form, the index after it, whether it is
-- byte-wise where the regex is character-wise (".", a negated class, \s:
-- Unicode spaces in ECMA) and whether it is several bytes (a non-ASCII
-- literal: no quantifier may follow it in Lua).
local function translate_atom(p, i)
  local ch = p:sub(i, i)
  if ch == "." then return "[^\n\r]", i + 1, true end
  if ch == "[" then return translate_set(p, i) end
  if ch:byte() >= 0x80 then
    local seq = p:match("^[\192-\247][\128-\191]*", i)
    if not seq then return nil end
    return seq, i + #seq, false, true
  end
  if ch == "\\" then
    local e = p:sub(i + 1, i + 1)
    if CLASS[e] then return CLASS[e], i + 2, e == "D" or e == "W" or e == "s" or e == "S" end
    if LITERAL_ESCAPES[e] then return LITERAL_ESCAPES[e], i + 2, false end
    if e:find("^%p$") then return lua_literal(e), i + 2, false end
    return nil
  end
  if ch:find("^[%(%)|%*%+%?{}%^%$]$") then return nil end
  return lua_literal(ch), i + 1, false
end

-- "{n}", "{n,}", "{n,m}" at i: n, m (nil: unbounded), the index after.
local function braces(p, i)
  local n, comma, m, j = p:match("^{(%d+)(,?)(%d*)}()", i)
  if not n then return nil end
  n = tonumber(n)
  if comma == "" then return n, n, j end
  return n, m ~= "" and tonumber(m) or nil, j
end

---The Lua pattern for an ECMA-262 regex, and whether it is byte-wise
---somewhere (holds ".", a negated class or \s: not to be applied to a
---string with non-ASCII bytes); nil when the regex is outside the subset.
---@param p string the regex (JSON Schema's `pattern`)
---@return string|nil lua the Lua pattern (string.find: a search, as the regex's test is)
---@return boolean? bytewise
function M.translate(p)
  local out, i, bytewise = {}, 1, false
  if p:sub(1, 1) == "^" then out[1], i = "^", 2 end
  while i <= #p do
    if p:sub(i) == "$" then
      out[#out + 1] = "$"
      break
    end
    local atom, j, bw, multibyte = translate_atom(p, i)
    if not atom then return nil end
    bytewise = bytewise or bw
    local q = p:sub(j, j)
    if multibyte and (q == "*" or q == "+" or q == "?" or q == "{") then return nil end
    if q == "*" or q == "+" or q == "?" then
      if p:sub(j + 1, j + 1) == "?" then return nil end -- lazy: not worth the risk
      out[#out + 1], i = atom .. q, j + 1
    elseif q == "{" then
      local n, m, k = braces(p, j)
      if not n or n > 100 or (m and (m < n or m > 100)) then return nil end
      out[#out + 1] = atom:rep(n)
      if m then out[#out + 1] = (atom .. "?"):rep(m - n) else out[#out + 1] = atom .. "*" end
      i = k
    else
      out[#out + 1], i = atom, j
    end
  end
  return table.concat(out), bytewise
end

return M
