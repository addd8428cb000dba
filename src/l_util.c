/*
 * l_util.c - what the binding files share: the one constructor of
 * expected-failure triples, `nil, message, code` (see mirza.h for the
 * codes), timeouts, option tables and the metatables of the userdata.
 */
#include "l_util.h"

#include <stdarg.h>
#include <string.h>

int mz_l_fail(lua_State *L, const char *msg, const char *code) {
  luaL_pushfail(L);
  lua_pushstring(L, msg);
  lua_pushstring(L, code);
  return 3;
}

int mz_l_failf(lua_State *L, const char *code, const char *fmt, ...) {
  va_list ap;
  luaL_pushfail(L);
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_pushstring(L, code);
  return 3;
}

const char **mz_l_strarray(lua_State *L, int anchors, int n) {
  const char **arr = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, anchors, i + 1);
    arr[i] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  arr[n] = NULL;
  return arr;
}

long mz_l_opt_ms(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return -1;
  lua_Number s = luaL_checknumber(L, idx);
  luaL_argcheck(L, s >= 0, idx, "negative timeout");
  return s > 1e9 ? -1 : (long)(s * 1000.0 + 0.5);
}

void mz_l_check_keys(lua_State *L, int idx, const char *const *keys, const char *who) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    int ok = 0;
    for (int i = 0; k && !ok && keys[i]; i++) ok = strcmp(k, keys[i]) == 0;
    if (!ok) luaL_error(L, "%s: unknown option '%s'", who, k ? k : luaL_typename(L, -1));
  }
}

lua_Number mz_l_check_option(lua_State *L, int vidx, const mz_l_option *o) {
  int isnum;
  lua_Number v = lua_tonumberx(L, vidx, &isnum);
  if (isnum && o->integer) lua_tointegerx(L, vidx, &isnum); /* 2.0 and "2" are integers, 2.5 is not */
  if (!isnum || !(v >= o->lo && v <= o->hi)) {              /* !(>= && <=): NaN fails too */
    const char *got = lua_type(L, vidx) == LUA_TSTRING ? lua_pushfstring(L, "\"%s\"", lua_tostring(L, vidx))
                                                       : luaL_tolstring(L, vidx, NULL);
    luaL_error(L, "%s: '%s' must be %s (got %s)", o->who, o->key, o->expected, got);
  }
  return v;
}

lua_Number mz_l_opt_field(lua_State *L, int idx, const mz_l_option *o, lua_Number def) {
  lua_Number v = def;
  if (lua_getfield(L, idx, o->key) != LUA_TNIL) v = mz_l_check_option(L, -1, o);
  lua_pop(L, 1);
  return v;
}

void mz_l_newclass(lua_State *L, const char *name, const luaL_Reg *meta, const luaL_Reg *methods) {
  if (luaL_newmetatable(L, name)) {
    luaL_setfuncs(L, meta, 0);
    int n = 0;
    while (methods[n].name) n++;
    lua_createtable(L, 0, n);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
}

void mz_l_weak_table(lua_State *L, const char *key, const char *mode) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, key) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, key);
}
