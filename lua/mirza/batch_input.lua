--- mirza.batch_input: a batch's input, read as a stream (mirza.batch).
---
--- A line is a JSON request (OpenAI's Batch API shape, or `{"prompt"}` /
--- `{"messages"}`) or a plain-text prompt. What a run keeps of a line it
--- has not sent yet is its custom_id in an id set (mirza.core.idset: a
--- 64-bit hash and the line number, 24-48 bytes), never its parsed body: the
--- input is scanned once before anything is sent (the ids, the duplicates,
--- the count), then read again line by line as slots free up. A UTF-8 BOM
--- at the start of any line is skipped (two exports joined by `cat`); a
--- JSON line that is not an object is an input error naming the line. A
--- numeric custom_id is its string, never rounded: an integer past 2^53 as
--- the digits written, a number Lua would round refused.
local mirza = require "mirza"
local core = require "mirza.core"
local pool_mod = require "mirza.pool"
local copy = require("mirza.util").copy
local json = mirza.json

local I = {}

-- In an id set's value: the id is in OUTPUT (done); the low bits hold the
-- input line that first had it (0: none yet).
I.DONE = 0x80000000
local LINE_BITS = 0x7fffffff

local BOM = "\239\187\191"

local byte, sub = string.byte, string.sub

-- A line as read: its CR and a BOM at its start taken off (on any line:
-- files joined by `cat` have one wherever a file began; a line without
-- pays one byte compared, `string.byte` as an upvalue).
local function clean(line)
  if byte(line, 1) == 0xEF and sub(line, 1, 3) == BOM then line = sub(line, 4) end
  if byte(line, -1) == 13 then line = sub(line, 1, -2) end
  return line
end

-- A body from a {"prompt": ...} line: other fields go into the body.
local function prompt_body(obj)
  local body = copy(obj)
  body.custom_id, body.prompt, body.system, body.schema = nil, nil, nil, nil
  local msgs = {}
  if obj.system then msgs[1] = { role = "system", content = obj.system } end
  msgs[#msgs + 1] = { role = "user", content = obj.prompt }
  body.messages = msgs
  return body
end

-- The custom_id of a decoded line: a string as it is, a number as its
-- string, never rounded (two ids that differ in a late digit stay two
-- items): an integer (exact: within 2^53 from JSON, any from a script) by
-- its digits (1 -> "1"); a JSON integer past 2^53, which decodes as a
-- float, as the digits written (`text`, json.peek's); another float as
-- Lua writes it when that reads back as the same number (1.5 -> "1.5").
-- Else nil and a message (a number Lua's 14 digits would round, another
-- type).
local function read_id(v, text)
  if v == nil or v == json.null then return nil end -- null: none (pandas writes it)
  if type(v) == "string" then return v end
  if math.type(v) == "integer" then return ("%d"):format(v) end
  if text and text:find("^%-?%d+$") then return text end
  if type(v) == "number" then
    local s = tostring(v)
    if tonumber(s) == v then return s end
    return nil, ("custom_id %s would be rounded (to %s): write it in quotes"):format(text or ("%.17g"):format(v), s)
  end
  return nil, "custom_id must be a string: write it in quotes"
end

-- A decoded line's custom_id as read_id reads it: a number JSON holds as
-- a float past 2^53 is peeked again for its digits (rare: one more parse).
local function decoded_id(obj, line)
  local v = obj.custom_id
  if type(v) == "number" and (v >= 2 ^ 53 or v <= -2 ^ 53) then
    local _, pv, text = json.peek(line, "custom_id")
    return read_id(pv, text)
  end
  return read_id(v)
end

---What a line's url asks for: "chat", "completions", "embeddings", or nil.
---@param url string
---@return string|nil
function I.kind_of(url)
  if url:find("/chat/completions$") then return "chat" end
  if url:find("/completions$") then return "completions" end
  if url:find("/embeddings$") then return "embeddings" end
  return nil
end

-- A JSON text's kind as a phrase ("an array", "a string"...).
local A_KIND = { array = "an array", string = "a string", number = "a number", boolean = "a boolean",
  null = "null" }

---The custom_id a line is recorded under, read without decoding the
---line into tables (`mirza.json.peek`): its `custom_id` (a number as its
---string, read_id), else "line-N"; false for a blank line. The line as
---given (a BOM and a CR are taken off here).
---@param line string
---@param n integer line number (1-based)
---@return string|false id
function I.line_id(line, n)
  local id = line:match('^{"custom_id":%s*"([^"\\]*)"') -- the common shape, read at once
  if id then return id end
  line = clean(line)
  if not line:find("%S") then return false end
  if line:match("^%s*{") then
    local kind, v, text = json.peek(line, "custom_id")
    if kind == "object" then
      id = read_id(v, text)
      if id then return id end
    end
  end
  return "line-" .. n
end

---Parse one input line. Returns the item, false for a blank line, or
---nil, a message and the line's custom_id when it could be read (the
---caller records the line under that id, else under "line-N").
---@param line string
---@param n integer line number (1-based)
---@return table|false|nil item {custom_id, body, line, kind ("chat", "completions", "embeddings"), schema?, url?}
---@return string? message
---@return string? custom_id of a rejected line, when readable
function I.parse_line(line, n)
  line = clean(line)
  if not line:find("%S") then return false end
  if not line:match("^%s*{") then
    local kind = json.peek(line, "custom_id")
    if kind then -- JSON, but not an object: not a prompt either
      return nil, ("line %d is JSON but %s, not an object: write one JSON object per line"
        .. " ({\"prompt\": ...}, {\"messages\": [...]} or {\"custom_id\", \"method\", \"url\", \"body\"}),"
        .. " or the prompt as plain text"):format(n, A_KIND[kind] or kind)
    end
    return { custom_id = "line-" .. n, body = { messages = { { role = "user", content = line } } }, line = n,
      kind = "chat" }
  end
  local obj, err = json.decode(line)
  if type(obj) ~= "table" then
    return nil, ("line %d: invalid JSON: %s: write one JSON object per line"):format(n, tostring(err))
  end
  local id, id_err = decoded_id(obj, line)
  if id_err then return nil, id_err end
  local function reject(msg) return nil, msg, id end
  id = id or ("line-" .. n)
  local sch = obj.schema
  if sch ~= nil and type(sch) ~= "table" and type(sch) ~= "string" then
    return reject("schema must be a JSON Schema (an object) or the path of a .json file")
  end
  if obj.body ~= nil then
    if type(obj.body) ~= "table" then return reject("body must be an object: {\"messages\": [...]}") end
    if obj.method and obj.method ~= "POST" then
      return reject("method must be POST, not " .. tostring(obj.method) .. ": use \"method\": \"POST\"")
    end
    local kind = obj.url == nil and "chat" or I.kind_of(tostring(obj.url))
    if not kind then
      return reject("unsupported url " .. tostring(obj.url) .. ": /v1/chat/completions, /v1/completions and"
        .. " /v1/embeddings are served")
    end
    if kind == "embeddings" and sch ~= nil then return reject("an /v1/embeddings line takes no schema") end
    return { custom_id = id, body = obj.body, line = n, kind = kind, schema = sch, url = obj.url }
  end
  if type(obj.prompt) == "string" then
    return { custom_id = id, body = prompt_body(obj), line = n, kind = "chat", schema = sch }
  end
  if type(obj.messages) == "table" then
    local body = copy(obj)
    body.custom_id, body.schema = nil, nil
    return { custom_id = id, body = body, line = n, kind = "chat", schema = sch }
  end
  return reject("a line needs \"body\" (with \"method\" and \"url\"), \"prompt\" or \"messages\"")
end

-- The schema a body's own response_format names: json_schema's schema,
-- or any JSON object for json_object.
local function body_schema(body)
  local rf = body.response_format
  if type(rf) ~= "table" then return nil end
  if rf.type == "json_schema" and type(rf.json_schema) == "table" and type(rf.json_schema.schema) == "table" then
    return rf.json_schema.schema
  end
  if rf.type == "json_object" then return { type = "object" } end
end

---A schema compiler that compiles each table or path once (mirza.schema):
---`compile(schema) -> compiled | nil, message`.
---@return fun(schema: table|string): table|nil, string?
function I.compiler()
  local done = setmetatable({}, { __mode = "k" }) -- a line's own schema table: forgotten with the line
  return function(sch)
    local c = done[sch]
    if c then return c end
    local msg
    c, msg = require("mirza.schema").compile(sch)
    if not c then return nil, msg end
    done[sch] = c
    return c
  end
end

---Make one item ready to send: its schema compiled (its line's, else its
---body's response_format, else the run's compiled `run_c`: `item.check`,
---and `item.rf` the response_format to send when the body has none) and
---its prefix key (`item.key`, mirza.pool.prefix_key). A schema that
---cannot be compiled makes the item invalid (recorded, code "input").
---@param it table
---@param compile fun(schema: table|string): table|nil, string?
---@param run_c? table the run's compiled schema
---@return table it
function I.prepare_item(it, compile, run_c)
  it.kind = it.kind or "chat" -- items given by a script: chat bodies
  if it.invalid or it.kind == "embeddings" or not it.body then return it end
  local own, c, msg = it.schema or body_schema(it.body), run_c, nil
  if own ~= nil then c, msg = compile(own) end
  if not c and msg then
    it.invalid = "schema: " .. tostring(msg)
  elseif c then
    it.check = c
    if it.body.response_format == nil then it.rf = require("mirza.schema").response_format(c) end
  end
  local b = it.body
  local lead = it.kind == "chat" and b.messages or b.prompt
  if type(lead) == "table" and it.kind == "completions" then lead = lead[1] end
  if type(lead) == "table" or type(lead) == "string" then it.key = pool_mod.prefix_key(lead) end
  return it
end

---Make items ready to send (I.prepare_item on each, the run's schema
---`o.schema` compiled first: nil and a message when it cannot be).
---@param items table[]
---@param o table the run's options (schema)
---@return table[]|nil items
---@return string? message
function I.prepare(items, o)
  local compile, run_c = I.compiler(), nil
  if o.schema ~= nil then
    local msg
    run_c, msg = compile(o.schema)
    if not run_c then return nil, "--schema: " .. tostring(msg) end
  end
  for _, it in ipairs(items) do I.prepare_item(it, compile, run_c) end
  return items
end

-- The lines of an open file, numbered: line, n (every line, blank ones too).
local function numbered(f)
  local n = 0
  return function()
    local line = f:read("l")
    if not line then return nil end
    n = n + 1
    return line, n
  end
end

-- Whether path can be read as INPUT: nil, or a message and a code. It is
-- read twice (the ids, then the items): a regular file only, not a pipe.
local function check_path(path)
  local _, _, kind = core.stat(path)
  if kind == "directory" then return path .. " is a directory: give INPUT as a file of prompts", "input" end
  if kind and kind ~= "file" then
    return ("%s is not a regular file (a pipe, a device): INPUT is read twice, its ids first; save it to a"
      .. " file first, e.g. gen > in.jsonl"):format(path), "input"
  end
end

---Scan an input file before anything is sent: each line's custom_id goes
---into `set` (its line number; an id already marked I.DONE by the
---output's scan keeps that mark and counts as done). Returns the number
---of items and of those already done, or nil, a message and a code: "io",
---"input" (a directory, no item at all, or a duplicate custom_id, named
---with both lines).
---@param path string
---@param set userdata mirza.core.idset
---@return integer|nil items
---@return integer|string done_or_message
---@return string? code
function I.scan(path, set)
  local perr, pcode = check_path(path)
  if perr then return nil, perr, pcode end
  local f, err = io.open(path, "rb")
  if not f then return nil, err, "io" end
  local items, done = 0, 0
  for line, n in numbered(f) do
    local id = I.line_id(line, n)
    if id then
      local v = set:get(id)
      if v and v & LINE_BITS ~= 0 then
        f:close()
        return nil, ("%s:%d: duplicate custom_id %q (first on line %d): give each line its own custom_id"):format(
          path, n, id, v & LINE_BITS), "input"
      end
      if n > LINE_BITS then
        f:close()
        return nil, ("%s: more than %d lines: split the input"):format(path, LINE_BITS), "input"
      end
      set:put(id, (v or 0) | n)
      items = items + 1
      if v then done = done + 1 end
    end
  end
  f:close()
  if items == 0 then
    return nil, path .. " holds no prompt (empty, or only blank lines): nothing to do; write one prompt or JSON"
      .. " request per line", "input"
  end
  return items, done
end

---Scan items given by a script (`items`): as I.scan, on their custom_ids.
---@param items table[]
---@param set userdata mirza.core.idset
---@return integer|nil items
---@return integer|string done_or_message
---@return string? code
function I.scan_items(items, set)
  local done = 0
  for i, it in ipairs(items) do
    local id, why = it.custom_id, nil
    if type(id) == "number" then it.custom_id, why = read_id(id) end -- recorded as the string a resume reads
    if why then error(("mirza.batch.run: items[%d]: %s"):format(i, why), 4) end -- never rounded
    if type(it.custom_id) ~= "string" then
      error(("mirza.batch.run: items[%d] needs a custom_id (a string), got %s"):format(i, tostring(id)), 4)
    end
    local v = set:get(it.custom_id)
    if v and v & LINE_BITS ~= 0 then
      return nil, ("items[%d]: duplicate custom_id %q (first at items[%d]): give each item its own custom_id")
        :format(i, it.custom_id, v & LINE_BITS), "input"
    end
    set:put(it.custom_id, (v or 0) | i)
    if v then done = done + 1 end
  end
  return #items, done
end

---A source of the items still to do, read as they are asked for: `next()`
---gives the next item not marked done in `set` (parsed and prepared; a
---bad line as an item with `invalid`), or nil at the end. Over a file
---(`path`) or a script's list (`items`). `close()` closes the file.
---@param o {input?: string, items?: table[]} the run's options
---@param set userdata mirza.core.idset
---@param compile fun(schema: table|string): table|nil, string?
---@param run_c? table the run's compiled schema
---@return {next: fun(): table|nil, close: fun()}|nil source
---@return string? message
function I.source(o, set, compile, run_c)
  local DONE = I.DONE
  if o.items then
    local i = 0
    return { close = function() end, next = function()
      while true do
        i = i + 1
        local it = o.items[i]
        if not it then return nil end
        if (set:get(it.custom_id) or 0) & DONE == 0 then return I.prepare_item(it, compile, run_c) end
      end
    end }
  end
  local f, err = io.open(o.input, "rb")
  if not f then return nil, err end
  local lines = numbered(f)
  local src = { close = function() if io.type(f) == "file" then f:close() end end }
  function src.next()
    for line, n in lines do
      local id = I.line_id(line, n)
      if id and (set:get(id) or 0) & DONE == 0 then
        local item, msg, rid = I.parse_line(line, n)
        if item == nil then item = { custom_id = rid or id, line = n, invalid = msg } end
        item.custom_id = id -- the id the scan saw (the two agree; this one is what resume finds)
        return I.prepare_item(item, compile, run_c)
      end
    end
    src.close()
    return nil
  end
  return src
end

---Read a whole input file into items (parsed; bad lines as items with
---`invalid`). For small inputs and tests: a run reads its input as a
---stream (I.scan, I.source). Duplicate custom_ids, a directory and a file
---without a single item are errors.
---@param path string
---@return table[]|nil items
---@return string? message
---@return string? code "io" or "input"
function I.read_input(path)
  local set <close> = core.idset()
  local n, err, code = I.scan(path, set)
  if not n then return nil, err, code end
  local src = assert(I.source({ input = path }, set, I.compiler()))
  local items = {}
  for it in src.next do items[#items + 1] = it end
  return items
end

return I
