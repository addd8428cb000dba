/*
 * l_idset.c - mirza.core.idset(): a set of strings with an integer each
 * (idset.c: 64-bit hashes, 12 bytes a slot, at most half full: 24-48 an id), for what a
 * batch run remembers of every item without keeping its id as a Lua
 * string: the custom_ids of its input (duplicates) and of its output.
 *
 *   local set <close> = core.idset()
 *   set:add(id, n) -> true | false, n_before   (n: an integer 0..2^32-1)
 *   set:put(id, n)                             (added, or given n)
 *   set:get(id) -> n | nil
 *   #set, set:bytes(), set:close()
 *
 * Built like l_guard.c: created closed, then allocated; close, __close and
 * __gc are one idempotent function; a method of a closed set raises.
 */
#include <lauxlib.h>

#include "idset.h"
#include "l_core.h"

#define IDSET_MT "mirza.IdSet"

typedef struct lidset {
  mz_idset *set; /* NULL: closed */
} lidset;

static mz_idset *check_open(lua_State *L) {
  lidset *u = luaL_checkudata(L, 1, IDSET_MT);
  if (!u->set) luaL_error(L, "attempt to use a closed id set");
  return u->set;
}

static uint32_t check_value(lua_State *L, int arg) {
  lua_Integer v = luaL_optinteger(L, arg, 0);
  luaL_argcheck(L, v >= 0 && v <= (lua_Integer)UINT32_MAX, arg, "an integer from 0 to 2^32-1 expected");
  return (uint32_t)v;
}

static int idset_add(lua_State *L) {
  mz_idset *set = check_open(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  uint32_t old = 0;
  int rc = mz_idset_add(set, s, n, check_value(L, 3), &old);
  if (rc < 0) return luaL_error(L, "not enough memory");
  lua_pushboolean(L, rc);
  if (rc) return 1;
  lua_pushinteger(L, old);
  return 2;
}

static int idset_put(lua_State *L) {
  mz_idset *set = check_open(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  if (mz_idset_put(set, s, n, check_value(L, 3)) < 0) return luaL_error(L, "not enough memory");
  return 0;
}

static int idset_get(lua_State *L) {
  mz_idset *set = check_open(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  uint32_t v;
  if (mz_idset_get(set, s, n, &v)) lua_pushinteger(L, v);
  else lua_pushnil(L);
  return 1;
}

static int idset_len(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)mz_idset_count(check_open(L)));
  return 1;
}

static int idset_bytes(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)mz_idset_bytes(check_open(L)));
  return 1;
}

static int idset_close(lua_State *L) {
  lidset *u = luaL_checkudata(L, 1, IDSET_MT);
  mz_idset_free(u->set);
  u->set = NULL;
  return 0;
}

static int idset_tostring(lua_State *L) {
  lidset *u = luaL_checkudata(L, 1, IDSET_MT);
  if (u->set) lua_pushfstring(L, "mirza.IdSet (%d ids)", (int)mz_idset_count(u->set));
  else lua_pushliteral(L, "mirza.IdSet (closed)");
  return 1;
}

int mz_l_idset(lua_State *L) {
  static const luaL_Reg meta[] = {{"__gc", idset_close},
                                  {"__close", idset_close},
                                  {"__len", idset_len},
                                  {"__tostring", idset_tostring},
                                  {NULL, NULL}};
  static const luaL_Reg methods[] = {{"add", idset_add},     {"put", idset_put},     {"get", idset_get},
                                     {"bytes", idset_bytes}, {"close", idset_close}, {NULL, NULL}};
  if (luaL_newmetatable(L, IDSET_MT)) {
    luaL_setfuncs(L, meta, 0);
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lidset *u = lua_newuserdatauv(L, sizeof *u, 0); /* created closed */
  u->set = NULL;
  luaL_setmetatable(L, IDSET_MT);
  u->set = mz_idset_new();
  if (!u->set) return luaL_error(L, "not enough memory");
  return 1;
}
