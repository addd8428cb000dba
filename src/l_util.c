/*
 * l_util.c - the one constructor of expected-failure triples,
 * `nil, message, code` (see mirza.h for the codes).
 */
#include "l_util.h"

#include <stdarg.h>

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
