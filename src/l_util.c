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
