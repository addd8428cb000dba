/*
 * fuzz_json.c - JSON <-> Lua (src/l_json.c, mirza.json), both ways round.
 *
 * The first byte picks the direction:
 *  - even: the rest is JSON text. If json.decode takes it, the value must
 *    encode, and decoding that text must give an equal value (deep
 *    compare; integers and floats compare by value), and so on once more.
 *    Of an object, each member json.peek gives past 2^53 with its text:
 *    that text must read as the same number (the digits of that member,
 *    not another's).
 *  - odd: the rest is a recipe for a Lua value (strings of any bytes,
 *    integers within +-2^53, finite floats, booleans, json.null, arrays,
 *    objects with string keys free of NUL (encode refuses those), empty
 *    tables). json.encode must take it and
 *    json.decode must give back an equal value.
 * The only errors allowed are the documented refusals: a decoded number
 * too large for a double (infinity) and nesting deeper than the encoder's
 * limit. Anything else raised, and any difference, aborts with the value.
 */
#include <lauxlib.h>
#include <lualib.h>
#include <string.h>

#include "fuzz.h"
#include "l_json.h"

static const char CHECKER[] =
    "local json, mode, s = ...\n"
    "local function eq(a, b, d)\n"
    "  if type(a) == 'number' and type(b) == 'number' then return a == b end\n"
    "  if type(a) ~= type(b) then return false end\n"
    "  if type(a) ~= 'table' then return a == b end\n"
    "  local n = 0\n"
    "  for k, v in pairs(a) do n = n + 1; if not eq(v, b[k], d + 1) then return false end end\n"
    "  for _ in pairs(b) do n = n - 1 end\n"
    "  return n == 0\n"
    "end\n"
    "local function allowed(e) e = tostring(e)\n"
    "  return e:find('cannot encode infinity', 1, true) or e:find('nesting deeper', 1, true) end\n"
    "local function again(v, what)\n"
    "  local ok, t = pcall(json.encode, v)\n"
    "  if not ok then assert(allowed(t), what .. ': encode raised: ' .. tostring(t)); return nil end\n"
    "  local v2, err = json.decode(t)\n"
    "  assert(v2 ~= nil, what .. ': decode refused what encode made: ' .. tostring(err) .. ' in ' .. t)\n"
    "  assert(eq(v, v2, 0), what .. ': value changed going through ' .. t)\n"
    "  return v2\n"
    "end\n"
    "local pos = 1\n"
    "local function byte() local b = s:byte(pos) or 0; pos = pos + 1; return b end\n"
    "local function gen(d)\n"
    "  local op = byte() % 8\n"
    "  if d > 6 and op >= 5 then op = op - 4 end\n"
    "  if op == 0 then return json.null\n"
    "  elseif op == 1 then return byte() % 2 == 1\n"
    "  elseif op == 2 then local x = 0\n"
    "    for _ = 1, 7 do x = x * 256 + byte() end\n"
    "    x = x % (2^53 | 0); if byte() % 2 == 1 then x = -x end; return x\n"
    "  elseif op == 3 then local raw = s:sub(pos, pos + 7); pos = pos + 8\n"
    "    local f = #raw == 8 and string.unpack('<d', raw) or 0.5\n"
    "    if f ~= f or f == math.huge or f == -math.huge then f = 0.25 end; return f\n"
    "  elseif op == 4 then local n = byte() % 24; local str = s:sub(pos, pos + n - 1); pos = pos + n; return str\n"
    "  elseif op == 5 then local t = {}; for i = 1, byte() % 5 + 1 do t[i] = gen(d + 1) end; return t\n"
    "  elseif op == 6 then local t = {}\n"
    "    for _ = 1, byte() % 5 + 1 do local k = gen(d + 1)\n"
    "      t[type(k) == 'string' and k:gsub('\\0', '') or tostring(k)] = gen(d + 1) end\n"
    "    if next(t) == nil then t.x = 1 end; return t\n"
    "  else return {} end\n"
    "end\n"
    "local function peeks(v)\n"
    "  if type(v) ~= 'table' then return end\n"
    "  for k in pairs(v) do\n"
    "    local _, pv, text = json.peek(s, tostring(k))\n"
    "    if text then\n"
    "      local n = tonumber(text); if math.type(n) == 'integer' then n = n + 0.0 end\n"
    "      assert(type(pv) == 'number' and (pv >= 2^53 or pv <= -2^53), 'peek: a text for ' .. tostring(pv))\n"
    "      assert(n == pv and s:find(text, 1, true), 'peek: member ' .. tostring(k) .. ' is ' .. tostring(pv)\n"
    "        .. ', its text ' .. text)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "if mode == 0 then\n"
    "  local v = json.decode(s)\n"
    "  if v == nil then return end\n"
    "  peeks(v)\n"
    "  local v2 = again(v, 'decoded')\n"
    "  if v2 ~= nil then again(v2, 'decoded twice') end\n"
    "else\n"
    "  local v = gen(0)\n"
    "  local ok, t = pcall(json.encode, v)\n"
    "  assert(ok, 'encode raised on a plain value: ' .. tostring(t))\n"
    "  again(v, 'built')\n"
    "end\n";

static lua_State *state;

static void close_state(void) {
  lua_close(state);
  state = NULL;
}

/* One state for all inputs (setting one up costs more than a check); the
 * checker chunk and the json module stay in stack slots 1 and 2. */
static void setup(void) {
  state = luaL_newstate();
  FUZZ_CHECK(state != NULL, "out of memory");
  luaL_openlibs(state);
  FUZZ_CHECK(luaL_loadbuffer(state, CHECKER, sizeof CHECKER - 1, "=checker") == LUA_OK, "%s", lua_tostring(state, -1));
  luaL_requiref(state, "mirza.json", luaopen_mirza_json, 0); /* [checker, json] */
  atexit(close_state);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (!state) setup();
  lua_settop(state, 2);
  lua_pushvalue(state, 1);
  lua_pushvalue(state, 2);
  lua_pushinteger(state, data[0] & 1);
  lua_pushlstring(state, (const char *)data + 1, size - 1); /* [checker, json, checker, json, mode, s] */
  if (lua_pcall(state, 3, 0, 0) != LUA_OK) {
    const char *msg = lua_tostring(state, -1);
    FUZZ_CHECK(0, "%s", msg ? msg : "(error object is not a string)");
  }
  lua_gc(state, LUA_GCSTEP, 0);
  return 0;
}
