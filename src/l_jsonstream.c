/*
 * l_jsonstream.c - mirza.json.stream{depth = N}: the incremental JSON
 * parser (jsonstream.c) as a Lua object, for a script that acts on each
 * record of a JSON answer while the rest is still being generated.
 *
 *   local p <close> = mirza.json.stream{depth = 1}
 *   for _, ev in ipairs(p:feed(delta)) do ... end  -- {type="json", path=, value=}
 *   p:feed(delta, list)                             -- the same, appended to list
 *   local ok, msg, code = p:finish()
 *
 * Built like liolib's files: the userdata is created closed, then the
 * parser's buffers are allocated; close, __close and __gc are one
 * idempotent function, and a method on a closed parser raises. Each
 * completed value is decoded in C: its bytes through mz_json_parse and
 * mz_l_pushjson, exactly as mirza.json.decode does (null is
 * mirza.json.null). The cJSON tree being converted is held by the
 * userdata, so a raise half-way through a value (memory) leaks nothing:
 * the next value or the close frees it.
 */
#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "jsonstream.h"
#include "l_json.h"
#include "l_util.h"
#include "mirza.h"

#define JSONSTREAM_MT "mirza.JSONStream"

typedef struct ljs {
  mz_jsonstream p;
  int open;    /* 0 until the parser is set up, and once closed */
  cJSON *tree; /* the value being converted, or NULL */
} ljs;

static ljs *check_open(lua_State *L) {
  ljs *u = luaL_checkudata(L, 1, JSONSTREAM_MT);
  if (!u->open) luaL_error(L, "attempt to use a closed JSON stream");
  return u;
}

static int js_close(lua_State *L) {
  ljs *u = luaL_checkudata(L, 1, JSONSTREAM_MT);
  cJSON_Delete(u->tree);
  u->tree = NULL;
  if (u->open) mz_js_free(&u->p);
  u->open = 0;
  return 0;
}

static int js_tostring(lua_State *L) {
  ljs *u = luaL_checkudata(L, 1, JSONSTREAM_MT);
  if (u->open) lua_pushfstring(L, "mirza.JSONStream (depth %d, %I values)", u->p.depth, (LUAI_UACINT)u->p.values);
  else lua_pushliteral(L, "mirza.JSONStream (closed)");
  return 1;
}

/* Push {type = "json", path = ..., value = ...} for v. */
static void push_event(lua_State *L, ljs *u, const mz_js_value *v) {
  size_t end = 0;
  cJSON_Delete(u->tree);
  u->tree = mz_json_parse(v->text, v->len, &end);
  if (!u->tree) /* the parser is stricter than cJSON: never, unless out of memory */
    luaL_error(L, "mirza.json.stream: cJSON refused the value at byte %I", (LUAI_UACINT)(v->offset + end + 1));
  lua_createtable(L, 0, 3);
  lua_pushliteral(L, "json");
  lua_setfield(L, -2, "type");
  lua_pushlstring(L, v->path, v->path_len);
  lua_setfield(L, -2, "path");
  mz_l_pushjson(L, u->tree, 0);
  lua_setfield(L, -2, "value");
  cJSON_Delete(u->tree);
  u->tree = NULL;
}

/* nil, message, "protocol" for the parser's sticky status. */
static int push_error(lua_State *L, const mz_jsonstream *p, int status) {
  if (status == MZ_JS_CUT)
    return mz_l_failf(L, MZ_E_PROTOCOL, "JSON cut at byte %I: the text ended inside the value", (LUAI_UACINT)p->err_at);
  if (status == MZ_JS_NOJSON)
    return mz_l_failf(L, MZ_E_PROTOCOL, "no JSON in the text (no %s)",
                      p->root == '{'   ? "{"
                      : p->root == '[' ? "["
                                       : "{ or [");
  return mz_l_failf(L, MZ_E_PROTOCOL, "invalid JSON at byte %I: %s", (LUAI_UACINT)(p->err_at + 1),
                    mz_js_strerror(status));
}

/* p:feed(text [, list]) -> the list of values completed by text (maybe
 * empty), or nil, message, "protocol", list (those completed before the
 * error). With a list given, the values are appended to it and it is
 * returned: no new table per piece (a stage feeding every delta). */
static int js_feed(lua_State *L) {
  ljs *u = check_open(L);
  size_t len, off = 0, used;
  const char *s = luaL_checklstring(L, 2, &len);
  lua_Integer n = 0;
  if (lua_isnoneornil(L, 3)) {
    lua_settop(L, 2);
    lua_newtable(L);
  } else {
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_settop(L, 3);
    n = (lua_Integer)lua_rawlen(L, 3);
  } /* [p, text, list] */
  for (;;) {
    mz_js_value v;
    int r = mz_js_feed(&u->p, s + off, len - off, &used, &v);
    off += used;
    if (r != MZ_JS_VALUE) {
      if (r >= 0) return 1;
      push_error(L, &u->p, r); /* [p, text, list, nil, msg, code] */
      lua_pushvalue(L, 3);
      return 4;
    }
    push_event(L, u, &v);
    lua_rawseti(L, 3, ++n);
  }
}

/* p:finish() -> true, or nil, message, "protocol" (cut, invalid, no JSON). */
static int js_finish(lua_State *L) {
  ljs *u = check_open(L);
  int r = mz_js_finish(&u->p);
  if (r < 0) return push_error(L, &u->p, r);
  lua_pushboolean(L, 1);
  return 1;
}

static int js_closed(lua_State *L) {
  lua_pushboolean(L, !((ljs *)luaL_checkudata(L, 1, JSONSTREAM_MT))->open);
  return 1;
}

int mz_l_json_stream(lua_State *L) {
  static const char *const keys[] = {"depth", "max_bytes", "root", "candidates", NULL};
  static const mz_l_option depth = {"mirza.json.stream", "depth", "an integer from 0 to 1000", 0, MZ_JS_MAX_NEST, 1};
  static const mz_l_option max = {"mirza.json.stream", "max_bytes", "a positive integer (bytes)", 1, 1e15, 1};
  static const mz_l_option tries = {"mirza.json.stream", "candidates", "an integer from 1 to 1000", 1, 1000, 1};
  static const luaL_Reg meta[] = {{"__gc", js_close}, {"__close", js_close}, {"__tostring", js_tostring}, {NULL, NULL}};
  static const luaL_Reg methods[] = {
      {"feed", js_feed}, {"finish", js_finish}, {"close", js_close}, {"closed", js_closed}, {NULL, NULL}};
  int d = 0, root = 0, n = 1;
  size_t cap = 0;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    mz_l_check_keys(L, 1, keys, "mirza.json.stream");
    d = (int)mz_l_opt_field(L, 1, &depth, 0);
    cap = (size_t)mz_l_opt_field(L, 1, &max, 0);
    n = (int)mz_l_opt_field(L, 1, &tries, 1);
    if (lua_getfield(L, 1, "root") != LUA_TNIL) {
      const char *r = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
      if (strcmp(r, "object") && strcmp(r, "array"))
        return luaL_error(L, "mirza.json.stream: 'root' must be \"object\" or \"array\" (got %s)",
                          luaL_tolstring(L, -1, NULL));
      root = r[0] == 'o' ? '{' : '[';
    }
    lua_pop(L, 1);
  }
  mz_l_newclass(L, JSONSTREAM_MT, meta, methods);
  ljs *u = lua_newuserdatauv(L, sizeof *u, 0); /* created closed */
  u->open = 0;
  u->tree = NULL;
  luaL_setmetatable(L, JSONSTREAM_MT);
  if (mz_js_init(&u->p, d, cap)) return luaL_error(L, "not enough memory");
  mz_js_start(&u->p, root, n);
  u->open = 1;
  return 1;
}
