--- mirza.schema: JSON Schema for structured answers — compiled once, sent
--- to the daemon as its constrained-output field, and checked here on the
--- decoded answer, never trusted.
---
--- `compile(S)` takes a schema (a Lua table, or the path of a .json file)
--- and resolves every `$ref` into `$defs`/`definitions` (any `#/...`
--- pointer into the same document) once; a cycle of references is a node
--- that points back to itself, so a recursive schema validates recursive
--- data. `validate(c, v)` walks the value and stops at the first violation,
--- giving its JSON pointer (RFC 6901: array indices from 0, as the model
--- wrote them) and a message the model can act on ("/items/2/price:
--- expected number, got string \"12\""). `decode(c, text)` is what a
--- request with `schema =` does with the answer: skip any preamble up to
--- the first bracket of the schema's root type (`{` for an object, `[`
--- for an array, either when the schema does not say: `root(c)`), take
--- that value (text after it is ignored: a closing code fence, a remark),
--- decode it with mirza.json, validate. A start that is not JSON before
--- any value inside it completes (prose: "{braces}", "[see below]") is
--- given up for the next bracket at or after the byte that broke it, up
--- to CANDIDATES starts: the rule of mirza.json.stream's `candidates`,
--- whose parser finds them, so the streamed `json` events and the decoded
--- answer agree.
---
--- What "first" means: the keywords of one schema are checked in a fixed
--- order (type, enum/const, the keywords of the value's type, then the
--- combinators), members in `required` order and then by name, items in
--- order, so the same answer always gives the same violation.
---
--- Checked: type (integer is a number with no fraction: 3.0 is one), enum,
--- const (deep equality), minimum/maximum/exclusiveMinimum/
--- exclusiveMaximum (draft 4's boolean exclusives too), multipleOf,
--- minLength/maxLength (UTF-8 characters), pattern (see below),
--- properties, required, additionalProperties (boolean or schema),
--- patternProperties, propertyNames, min/maxProperties,
--- dependentRequired, dependentSchemas, items (a schema, or draft 4-7's
--- array form), prefixItems, additionalItems, contains/minContains/
--- maxContains, min/maxItems, uniqueItems, allOf/anyOf/oneOf, not,
--- if/then/else, boolean schemas, $ref. `M.UNCHECKED` lists the keywords
--- that are accepted and sent but not checked here.
---
--- `pattern` is ECMA-262 regex and Lua has none: a pattern made only of
--- literals, `.`, classes (`\d \w \s`, their negations, `[...]`), the
--- quantifiers `* + ? {n} {n,} {n,m}` on one of those, and a leading `^` /
--- trailing `$` is translated into the Lua pattern that matches the same
--- strings (mirza.regex); any other pattern (groups, `|`, lookaround, `\b`, ...) is
--- left unchecked and listed in `c.unchecked`, never approximated. Lua
--- matches bytes, the regex code points: a translated pattern holding `.`
--- or a negated class is not applied to a string with non-ASCII bytes
--- (unchecked for that string rather than wrong).
---
--- Decoded JSON (mirza.json.decode): `null` is `mirza.json.null`, an
--- integer beyond 2^53 is a float (its type is still integer when it has
--- no fraction), a duplicated member keeps its last value, and an array
--- is marked as mirza.json.array marks one: a decoded `[]` is an array
--- only, while `{}` (a plain empty table, as a script's own `{}` is) is
--- taken as either an array or an object (unless marked with
--- mirza.json.array / mirza.json.object).
local json = require("mirza.core").json
local regex = require "mirza.regex"

local M = {}

---Keywords accepted (and sent to the daemon) but not checked here.
M.UNCHECKED = { "format", "contentEncoding", "contentMediaType", "contentSchema", "unevaluatedProperties",
  "unevaluatedItems", "$dynamicRef", "$recursiveRef", "dependencies" }

local UNCHECKED_SET = {}
for _, k in ipairs(M.UNCHECKED) do UNCHECKED_SET[k] = true end

local Compiled = { __name = "mirza.schema" }
Compiled.__index = Compiled

---@class mirza.Schema
---@field schema table|boolean the schema as given (or decoded from its file)
---@field unchecked string[] "keyword at /pointer" for each keyword present in the schema but not checked
---@field root table the compiled root node

local TYPES = { null = true, boolean = true, number = true, integer = true, string = true, array = true,
  object = true }

-- Keywords whose value is a list: marked as JSON arrays in the copy sent
-- to the daemon, so an empty one is `[]`, not `{}`.
local LISTS = { required = true, enum = true, type = true, anyOf = true, oneOf = true, allOf = true,
  prefixItems = true, items = true }

-- ------------------------------------------------------------ pointers

local function escape(key)
  return (tostring(key):gsub("~", "~0"):gsub("/", "~1"))
end

local function unescape(token)
  token = token:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
  return (token:gsub("~1", "/"):gsub("~0", "~"))
end

local function where(ptr)
  return ptr == "" and "(root)" or ptr
end

-- ------------------------------------------------------------ compiling

local function bad(msg)
  error({ schema_error = msg }, 0)
end

local compile_node

local function resolve(ctx, ref, at)
  if ref:sub(1, 1) ~= "#" then bad(at .. ": $ref " .. ref .. " is not a pointer into this schema (#/...)") end
  local target = ctx.root
  for token in ref:sub(2):gmatch("[^/]+") do
    if type(target) ~= "table" then break end
    local key = unescape(token)
    local v = target[key]
    if v == nil and key:match("^%d+$") then v = target[tonumber(key) + 1] end
    target = v
  end
  if target == nil or (type(target) ~= "table" and type(target) ~= "boolean") then
    bad(at .. ": $ref " .. ref .. " points to nothing")
  end
  return compile_node(ctx, target, ref)
end

local function node_list(ctx, s, key, at)
  local list = s[key]
  if list == nil then return nil end
  if type(list) ~= "table" or list[1] == nil then bad(at .. "/" .. key .. ": expected a non-empty array of schemas") end
  local out = {}
  for i, sub in ipairs(list) do out[i] = compile_node(ctx, sub, at .. "/" .. key .. "/" .. (i - 1)) end
  return out
end

local function node_map(ctx, s, key, at)
  local map = s[key]
  if map == nil then return nil end
  if type(map) ~= "table" then bad(at .. "/" .. key .. ": expected an object of schemas") end
  local names, nodes = {}, {}
  for k, sub in pairs(map) do
    names[#names + 1] = k
    nodes[k] = compile_node(ctx, sub, at .. "/" .. key .. "/" .. escape(k))
  end
  table.sort(names)
  return nodes, names
end

local function compile_types(t, at)
  if t == nil then return nil end
  local list = type(t) == "table" and t or { t }
  local set = {}
  for _, name in ipairs(list) do
    if not TYPES[name] then bad(at .. "/type: unknown type " .. tostring(name)) end
    set[name] = true
  end
  return { set = set, list = list }
end

local function compile_pattern(ctx, p, at)
  if type(p) ~= "string" then bad(at .. ": a pattern must be a string") end
  local lua, bytewise = regex.translate(p)
  if not lua then
    ctx.unchecked[#ctx.unchecked + 1] = "pattern " .. p .. " at " .. where(at)
    return false
  end
  return { lua = lua, bytewise = bytewise, source = p }
end

local function number_kw(s, k, at)
  local v = s[k]
  if v ~= nil and type(v) ~= "number" and not (type(v) == "boolean" and k:find("^exclusive")) then
    bad(at .. "/" .. k .. ": expected a number")
  end
  return v
end

local function compile_object_kws(ctx, n, s, at)
  n.properties, n.property_names = node_map(ctx, s, "properties", at)
  local pp, pp_names = node_map(ctx, s, "patternProperties", at)
  if pp then
    n.pattern_properties = {}
    for _, k in ipairs(pp_names) do
      n.pattern_properties[#n.pattern_properties + 1] = { pattern = compile_pattern(ctx, k, at), node = pp[k] }
    end
  end
  local ap = s.additionalProperties
  if ap ~= nil then n.additional = compile_node(ctx, ap, at .. "/additionalProperties") end
  if s.propertyNames ~= nil then n.names = compile_node(ctx, s.propertyNames, at .. "/propertyNames") end
  if s.required ~= nil then
    if type(s.required) ~= "table" then bad(at .. "/required: expected an array of names") end
    n.required = s.required
  end
  n.dependent_required = s.dependentRequired
  n.dependent_schemas = node_map(ctx, s, "dependentSchemas", at)
end

local function compile_array_kws(ctx, n, s, at)
  local items = s.items
  if type(items) == "table" and items[1] ~= nil then -- draft 4-7: a list is prefixItems
    n.prefix = node_list(ctx, s, "items", at)
    if s.additionalItems ~= nil then n.items = compile_node(ctx, s.additionalItems, at .. "/additionalItems") end
  elseif items ~= nil then
    n.items = compile_node(ctx, items, at .. "/items")
  end
  if s.prefixItems ~= nil then n.prefix = node_list(ctx, s, "prefixItems", at) end
  if s.contains ~= nil then n.contains = compile_node(ctx, s.contains, at .. "/contains") end
end

function compile_node(ctx, s, at)
  if s == true or s == false then return { bool = s } end
  if type(s) ~= "table" then bad(where(at) .. ": a schema must be an object or a boolean, got " .. type(s)) end
  local known = ctx.memo[s]
  if known then return known end
  local n = { s = s }
  ctx.memo[s] = n -- before the children: a cycle finds this node
  n.types = compile_types(s.type, at)
  for _, k in ipairs { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
    "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains" } do
    number_kw(s, k, at)
  end
  if s.enum ~= nil and type(s.enum) ~= "table" then bad(at .. "/enum: expected an array") end
  if s.pattern ~= nil then n.pattern = compile_pattern(ctx, s.pattern, at .. "/pattern") end
  compile_object_kws(ctx, n, s, at)
  compile_array_kws(ctx, n, s, at)
  n.all = node_list(ctx, s, "allOf", at)
  n.any = node_list(ctx, s, "anyOf", at)
  n.one = node_list(ctx, s, "oneOf", at)
  if s["not"] ~= nil then n["not"] = compile_node(ctx, s["not"], at .. "/not") end
  if s["if"] ~= nil then
    n["if"] = compile_node(ctx, s["if"], at .. "/if")
    if s["then"] ~= nil then n["then"] = compile_node(ctx, s["then"], at .. "/then") end
    if s["else"] ~= nil then n["else"] = compile_node(ctx, s["else"], at .. "/else") end
  end
  if s["$ref"] ~= nil then n.ref = resolve(ctx, s["$ref"], at) end
  for k in pairs(s) do
    if UNCHECKED_SET[k] then ctx.unchecked[#ctx.unchecked + 1] = k .. " at " .. where(at) end
  end
  return n
end

local function read_schema(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, "schema: " .. err, "io" end
  local text = f:read("a")
  f:close()
  local s, msg = json.decode(text)
  if s == nil then return nil, "schema " .. path .. ": " .. msg, "schema" end
  return s
end

---Compile a JSON Schema: a Lua table (or boolean), or the path of a .json
---file holding one. `$ref`s are resolved here, once.
---@param S table|boolean|string|mirza.Schema a compiled schema is returned as is
---@return mirza.Schema|nil c
---@return string? message
---@return string? code "io" (the file cannot be read) | "schema" (not JSON, or not a schema)
function M.compile(S)
  if getmetatable(S) == Compiled then return S end
  local s = S
  if type(S) == "string" then
    local msg, code
    s, msg, code = read_schema(S)
    if s == nil then return nil, msg, code end
  end
  local ctx = { root = s, memo = {}, unchecked = {} }
  local ok, root = pcall(compile_node, ctx, s, "")
  if not ok then
    if type(root) == "table" and root.schema_error then return nil, "schema: " .. root.schema_error, "schema" end
    error(root, 0)
  end
  return setmetatable({ schema = s, root = root, unchecked = ctx.unchecked }, Compiled)
end

-- `c` compiled (M.compile returns a compiled schema as it is); one that
-- does not compile raises at the caller of the public function that
-- called this one (level 3), as a bad argument of that function.
local function compiled(c)
  local r, msg = M.compile(c)
  if not r then error(msg, 3) end
  return r
end

-- ------------------------------------------------------------ values

local null = json.null

local function is_array(v)
  if type(v) ~= "table" then return false end
  local mt = getmetatable(v)
  local name = mt and mt.__name
  if name == "mirza.json.array" then return true end
  if name == "mirza.json.object" then return false end
  return v[1] ~= nil or next(v) == nil
end

local function is_object(v)
  if type(v) ~= "table" then return false end
  local mt = getmetatable(v)
  local name = mt and mt.__name
  if name == "mirza.json.object" then return true end
  if name == "mirza.json.array" then return false end
  return v[1] == nil
end

local function is_integer(v)
  return math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v) and v - v == 0)
end

local TYPE_CHECK = {
  null = function(v) return v == null end,
  boolean = function(v) return type(v) == "boolean" end,
  number = function(v) return type(v) == "number" end,
  integer = is_integer,
  string = function(v) return type(v) == "string" end,
  array = is_array,
  object = is_object,
}

local function type_of(v)
  if v == null then return "null" end
  local t = type(v)
  if t == "table" then
    local mt = getmetatable(v)
    return (v[1] ~= nil or (mt and mt.__name) == "mirza.json.array") and "array" or "object"
  end
  if t == "number" then return is_integer(v) and "integer" or "number" end
  return t
end

-- The value as the model would read it, cut to about 60 bytes.
local function show(v)
  local ok, text = pcall(json.encode, v)
  if not ok then text = tostring(v) end
  if #text > 60 then text = text:sub(1, 57):gsub("[\128-\191]*$", "") .. "..." end
  return text
end

local function got(v)
  local t = type_of(v)
  if t == "null" then return "got null" end
  if t == "integer" then t = "number" end
  return "got " .. t .. " " .. show(v)
end

local function equal(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  if is_array(a) ~= is_array(b) and next(a) ~= nil then return false end
  for k, v in pairs(a) do
    if not equal(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end
M._equal = equal

local function utf8_len(s)
  return utf8.len(s) or #s
end

local function matches(pat, s)
  if pat.bytewise and s:find("[\128-\255]") then return true end
  return s:find(pat.lua) ~= nil
end

-- ------------------------------------------------------------ validating
-- check(n, v, d) -> nil when v satisfies node n, else message, pointer.
-- The value's place is path[1..d] (member names, array indices from 0),
-- one stack shared by the walk: a level writes path[d + 1] before going
-- down, and a violation's pointer is made from it at once, so a valid
-- value costs no pointer string at all. (validate does not yield: the
-- stack is never shared by two walks at once.)

local check
local path = {}
local EMPTY = {} -- an absent list, never written

local function pointer(d)
  if d == 0 then return "" end
  local parts = {}
  for i = 1, d do parts[i] = escape(path[i]) end
  return "/" .. table.concat(parts, "/")
end

local function fail(d, msg)
  local ptr = pointer(d)
  return where(ptr) .. ": " .. msg, ptr
end

local function check_type(n, v, d)
  local types = n.types
  if not types then return nil end
  for name in pairs(types.set) do
    if TYPE_CHECK[name](v) then return nil end
  end
  return fail(d, "expected " .. table.concat(types.list, " or ") .. ", " .. got(v))
end

local function check_enum(s, v, d)
  if s.enum ~= nil then
    local found = false
    for _, e in ipairs(s.enum) do
      if equal(e, v) then
        found = true
        break
      end
    end
    if not found then
      local shown = {}
      for i, e in ipairs(s.enum) do shown[i] = show(e) end
      return fail(d, "expected one of " .. table.concat(shown, ", ") .. ", " .. got(v))
    end
  end
  if s.const ~= nil and not equal(s.const, v) then return fail(d, "expected " .. show(s.const) .. ", " .. got(v)) end
end

local function check_number(s, v, d)
  local function bound(ok, rel, limit)
    if not ok then return fail(d, "expected a number " .. rel .. " " .. show(limit) .. ", got " .. show(v)) end
  end
  local emin, emax = s.exclusiveMinimum, s.exclusiveMaximum
  local m, e
  if s.minimum ~= nil then
    if emin == true then m, e = bound(v > s.minimum, ">", s.minimum)
    else m, e = bound(v >= s.minimum, ">=", s.minimum) end
    if m then return m, e end
  end
  if s.maximum ~= nil then
    if emax == true then m, e = bound(v < s.maximum, "<", s.maximum)
    else m, e = bound(v <= s.maximum, "<=", s.maximum) end
    if m then return m, e end
  end
  if type(emin) == "number" and v <= emin then return bound(false, ">", emin) end
  if type(emax) == "number" and v >= emax then return bound(false, "<", emax) end
  local mult = s.multipleOf
  if mult and mult > 0 then
    local q = v / mult
    if math.abs(q - math.floor(q + 0.5)) > 1e-9 * math.max(1, math.abs(q)) then
      return fail(d, "expected a multiple of " .. show(mult) .. ", got " .. show(v))
    end
  end
end

local function check_string(n, s, v, d)
  if s.minLength or s.maxLength then
    local len = utf8_len(v)
    if s.minLength and len < s.minLength then
      return fail(d, "expected at least " .. s.minLength .. " characters, got " .. len .. " (" .. show(v) .. ")")
    end
    if s.maxLength and len > s.maxLength then
      return fail(d, "expected at most " .. s.maxLength .. " characters, got " .. len .. " (" .. show(v) .. ")")
    end
  end
  if n.pattern and not matches(n.pattern, v) then
    return fail(d, "expected a string matching /" .. n.pattern.source .. "/, " .. got(v))
  end
end

-- The members not in `properties` (names, patternProperties,
-- additionalProperties) over `keys`, in that order.
local function scan_members(n, v, d, keys)
  local kd = d + 1
  for _, k in ipairs(keys) do
    path[kd] = k
    local sub, known = v[k], n.properties and n.properties[k] ~= nil
    if n.names then
      local m = check(n.names, k, kd)
      if m then return fail(kd, "member name " .. show(k) .. " is not allowed (propertyNames: " .. m .. ")") end
    end
    for _, pp in ipairs(n.pattern_properties or EMPTY) do
      if pp.pattern == false then
        known = true -- unchecked: take it as matched rather than call the member additional
      elseif matches(pp.pattern, k) then
        known = true
        local m, e = check(pp.node, sub, kd)
        if m then return m, e end
      end
    end
    if not known and n.additional then
      if n.additional.bool == false then
        local names = n.property_names
        local allowed = names and #names > 0 and table.concat(names, ", ") or "none"
        return fail(kd, "member not allowed (the object at " .. where(pointer(d)) .. " takes only: " .. allowed .. ")")
      end
      local m, e = check(n.additional, sub, kd)
      if m then return m, e end
    end
  end
end

local function check_members(n, v, d)
  for _, k in ipairs(n.property_names or EMPTY) do
    if v[k] ~= nil then
      path[d + 1] = k
      local m, e = check(n.properties[k], v[k], d + 1)
      if m then return m, e end
    end
  end
  if not (n.names or n.pattern_properties or n.additional) then return nil end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = tostring(k) end
  if not scan_members(n, v, d, keys) then return nil end
  table.sort(keys) -- a violation: the first by name, whatever the table's order
  return scan_members(n, v, d, keys)
end

local function count(t)
  local c = 0
  for _ in pairs(t) do c = c + 1 end
  return c
end

local function check_object(n, s, v, d)
  for _, k in ipairs(n.required or EMPTY) do
    if v[k] == nil then return fail(d, "missing required member " .. show(k)) end
  end
  for k, list in pairs(n.dependent_required or EMPTY) do
    if v[k] ~= nil then
      for _, dep in ipairs(list) do
        if v[dep] == nil then
          return fail(d, "missing member " .. show(dep) .. " (required when " .. show(k) .. " is present)")
        end
      end
    end
  end
  if s.minProperties or s.maxProperties then
    local c = count(v)
    if s.minProperties and c < s.minProperties then
      return fail(d, "expected at least " .. s.minProperties .. " members, got " .. c)
    end
    if s.maxProperties and c > s.maxProperties then
      return fail(d, "expected at most " .. s.maxProperties .. " members, got " .. c)
    end
  end
  local m, e = check_members(n, v, d)
  if m then return m, e end
  for k, sub in pairs(n.dependent_schemas or EMPTY) do
    if v[k] ~= nil then
      m, e = check(sub, v, d)
      if m then return m, e end
    end
  end
end

local function check_contains(n, s, v, d)
  local hits = 0
  for i = 1, #v do
    path[d + 1] = i - 1
    if not check(n.contains, v[i], d + 1) then hits = hits + 1 end
  end
  local lo, hi = s.minContains or 1, s.maxContains
  if hits < lo then return fail(d, "expected at least " .. lo .. " items matching contains, got " .. hits) end
  if hi and hits > hi then return fail(d, "expected at most " .. hi .. " items matching contains, got " .. hits) end
end

local function check_array(n, s, v, d)
  local len = #v
  if s.minItems and len < s.minItems then
    return fail(d, "expected at least " .. s.minItems .. " items, got " .. len)
  end
  if s.maxItems and len > s.maxItems then
    return fail(d, "expected at most " .. s.maxItems .. " items, got " .. len)
  end
  local prefix = n.prefix or {}
  for i = 1, len do
    local sub = prefix[i] or n.items
    if not sub then break end
    path[d + 1] = i - 1
    local m, e = check(sub, v[i], d + 1)
    if m then return m, e end
  end
  if s.uniqueItems == true then
    for i = 2, len do
      for j = 1, i - 1 do
        if equal(v[i], v[j]) then
          path[d + 1] = i - 1
          return fail(d + 1, "duplicate of " .. pointer(d) .. "/" .. (j - 1) .. " (the items must be unique)")
        end
      end
    end
  end
  if n.contains then return check_contains(n, s, v, d) end
end

-- The alternative the answer most likely meant: the one whose violation
-- lies deepest in the value, and among equals one whose type it has.
local function closest(list, v, d)
  local best, best_score
  for _, sub in ipairs(list) do
    local m, e = check(sub, v, d)
    local score = m and #e * 2 + ((sub.bool ~= nil or not check_type(sub, v, d)) and 1 or 0)
    if m and (not best or score > best_score) then best, best_score = m, score end
  end
  return best
end

local function check_combinators(n, v, d)
  for _, sub in ipairs(n.all or EMPTY) do
    local m, e = check(sub, v, d)
    if m then return m, e end
  end
  if n.any then
    local ok = false
    for _, sub in ipairs(n.any) do
      if not check(sub, v, d) then
        ok = true
        break
      end
    end
    if not ok then
      return fail(d, "matches none of the anyOf alternatives (closest: " .. closest(n.any, v, d) .. ")")
    end
  end
  if n.one then
    local hits = {}
    for i, sub in ipairs(n.one) do
      if not check(sub, v, d) then hits[#hits + 1] = i end
    end
    if #hits == 0 then
      return fail(d, "matches none of the oneOf alternatives (closest: " .. closest(n.one, v, d) .. ")")
    end
    if #hits > 1 then
      return fail(d, "matches oneOf alternatives " .. table.concat(hits, " and ") .. ", expected exactly one")
    end
  end
  if n["not"] and not check(n["not"], v, d) then
    return fail(d, "matches the schema under not, which it must not")
  end
  if n["if"] then
    local branch = n["then"]
    if check(n["if"], v, d) then branch = n["else"] end
    if branch then return check(branch, v, d) end
  end
end

function check(n, v, d)
  if n.bool ~= nil then
    if n.bool then return nil end
    return fail(d, "no value is allowed here, " .. got(v))
  end
  local s = n.s
  local m, e = check_type(n, v, d)
  if m then return m, e end
  m, e = check_enum(s, v, d)
  if m then return m, e end
  if type(v) == "number" then m, e = check_number(s, v, d)
  elseif type(v) == "string" then m, e = check_string(n, s, v, d)
  elseif type(v) == "table" then
    -- an empty table is both: each side's keywords apply unless the type rules it out
    local set = n.types and n.types.set
    if is_array(v) and (not set or set.array) then m, e = check_array(n, s, v, d) end
    if not m and is_object(v) and (not set or set.object) then m, e = check_object(n, s, v, d) end
  end
  if m then return m, e end
  if n.ref then
    m, e = check(n.ref, v, d)
    if m then return m, e end
  end
  return check_combinators(n, v, d)
end

---Check a value against a compiled schema (a schema not compiled yet is
---compiled here; a bad one raises).
---@param c mirza.Schema|table|string
---@param value any
---@return boolean ok
---@return string? message "/items/2/price: expected number, got string \"12\"" ("(root)" for the whole value)
---@return string? pointer the JSON pointer of the first violation ("" for the whole value; array indices from 0)
function M.validate(c, value)
  c = compiled(c)
  local m, e = check(c.root, value, 0)
  if m then return false, m, e end
  return true
end

-- ------------------------------------------------------------ decoding

-- The index of the byte that closes the value opened at i ("{" or "["),
-- or nil when the text ends first. Strings are skipped whole, so a
-- bracket inside one does not count; mismatched brackets are left to
-- json.decode.
local function value_end(text, i)
  local depth, pos = 0, i
  while true do
    local j, _, ch = text:find('([%[%]{}"])', pos)
    if not j then return nil end
    if ch == '"' then
      local k = j + 1
      while true do
        local q, _, c2 = text:find('(["\\])', k)
        if not q then return nil end
        k = q + (c2 == "\\" and 2 or 1)
        if c2 == '"' then break end
      end
      pos = k
    else
      depth = depth + ((ch == "{" or ch == "[") and 1 or -1)
      pos = j + 1
      if depth == 0 then return j end
    end
  end
end

local function begins(text)
  local s = text:gsub("%s+", " "):sub(1, 40)
  return #text > 40 and s .. "..." or s
end

---How many starts `decode` tries (the first, then the next ones after a
---start that is not JSON).
M.CANDIDATES = 8

-- The root type a node pins down: "object", "array", or nil (either, or
-- neither: a string schema). Follows $ref and allOf; anyOf/oneOf when
-- every alternative agrees.
local function root_of(n, seen)
  if n.bool ~= nil or seen[n] then return nil end
  seen[n] = true
  local set = n.types and n.types.set
  if set and set.object ~= set.array then return set.object and "object" or "array" end
  if set then return nil end
  local r = n.ref and root_of(n.ref, seen)
  if r then return r end
  for _, sub in ipairs(n.all or EMPTY) do
    r = root_of(sub, seen)
    if r then return r end
  end
  for _, list in ipairs { n.any or EMPTY, n.one or EMPTY } do
    local agreed
    for i, sub in ipairs(list) do
      local k = root_of(sub, seen)
      if not k or (i > 1 and k ~= agreed) then
        agreed = nil
        break
      end
      agreed = k
    end
    if agreed then return agreed end
  end
end

---The type of the value a schema's answer is: "object" or "array" when
---the schema says so (its `type`, through `$ref`, `allOf`, and `anyOf` /
---`oneOf` when all their alternatives agree), else nil. The answer's JSON
---starts at the first `{` (object) or `[` (array), either when nil.
---@param c mirza.Schema|table|string
---@return "object"|"array"|nil
function M.root(c)
  c = compiled(c)
  return root_of(c.root, {})
end

local START = { object = "{", array = "%[" }

-- The value of the first start from i on that is JSON, as the strict
-- parser (mirza.json.stream) finds it with the rule of the json events;
-- else nil, its message, and whether the text ended inside a start.
local function later(text, i, root)
  local p <close> = json.stream { root = root, candidates = M.CANDIDATES }
  local evs, msg = p:feed(i > 1 and text:sub(i) or text)
  if evs and evs[1] then return evs[1].value end
  if evs then
    local _
    _, msg = p:finish()
  end
  return nil, msg, msg:find("^JSON cut") ~= nil
end

---Take the JSON value out of an answer and check it: text before the
---first bracket of the schema's root type (`root`) is skipped, text after
---that value ends is ignored; a start that is not JSON gives way to the
---next (see the module comment).
---@param c mirza.Schema|table|string
---@param text string the answer
---@return any|nil value the decoded value (null is mirza.json.null)
---@return string? message what is wrong: no JSON, a cut value, invalid JSON, or the first violation (pointer first)
---@return string? code "schema"
---@return string? raw the answer as given
---@return string? pointer the violation's JSON pointer (a value that decoded but did not validate)
function M.decode(c, text)
  c = compiled(c)
  text = text or ""
  local root = root_of(c.root, {})
  local i = text:find(START[root] or "[%[{]")
  if not i then
    return nil, ("the answer holds no JSON%s (it begins: %s)"):format(root and " " .. root or "", show(begins(text))),
        "schema", text
  end
  -- the common answer ends with its value: one decode, no scan
  local last, v = text:find("[%]}]%s*$", i), nil
  if last then v = json.decode(text:sub(i, last)) end
  if v == nil then
    local j = value_end(text, i)
    local msg
    if j then v, msg = json.decode(text:sub(i, j)) end
    if v == nil then
      local why, cut
      v, why, cut = later(text, i, root)
      if v == nil then
        if cut then return nil, "the JSON in the answer is cut (it ends before its value closes)", "schema", text end
        return nil, "the answer is not valid JSON: " .. (msg or why), "schema", text
      end
    end
  end
  local ok, vmsg, ptr = M.validate(c, v)
  if not ok then return nil, vmsg, "schema", text, ptr end
  return v
end

-- A copy of the schema for the request body: every list-valued keyword
-- marked as a JSON array (an empty `required` is [], not {}).
local function wire_copy(s, key, seen)
  if type(s) ~= "table" or s == null then return s end
  if seen[s] then return seen[s] end
  local out = {}
  seen[s] = out
  for k, v in pairs(s) do out[k] = wire_copy(v, k, seen) end
  local mt = getmetatable(s)
  if mt and (mt.__name == "mirza.json.array" or mt.__name == "mirza.json.object") then setmetatable(out, mt)
  elseif LISTS[key] and (s[1] ~= nil or next(s) == nil) then json.array(out) end
  return out
end

---The daemon's constrained-output field for this schema (the OpenAI
---shape llama-server, vLLM, MTPLX and Ollama's /v1 take).
---@param c mirza.Schema|table|string
---@param name? string the schema's name (default: its title, made a valid name, or "answer")
---@return table rf `{type = "json_schema", json_schema = {name =, schema =, strict = true}}`
function M.response_format(c, name)
  c = compiled(c)
  local s = c.schema
  if not name then
    local title = type(s) == "table" and type(s.title) == "string" and s.title:gsub("[^%w_%-]", "_"):sub(1, 64)
    name = title and title ~= "" and title or "answer"
  end
  return { type = "json_schema", json_schema = { name = name, schema = wire_copy(s, nil, {}), strict = true } }
end

return M
