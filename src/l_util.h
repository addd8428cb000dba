/*
 * l_util.h - helpers shared by the binding files (l_*.c): the one way to
 * return an expected failure, `nil, message, code`.
 */
#ifndef MIRZA_L_UTIL_H
#define MIRZA_L_UTIL_H

#include <lua.h>
#include <lauxlib.h>

/* Push nil, msg, code; return 3 (use as `return mz_l_fail(L, msg, code);`). */
int mz_l_fail(lua_State *L, const char *msg, const char *code);
/* Same with a printf-style message. */
int mz_l_failf(lua_State *L, const char *code, const char *fmt, ...);

/* Push a userdata holding a NULL-terminated array of the n strings at
 * anchors[1..n] (the table at index `anchors` keeps them alive; it must
 * outlive the array's use). Returns the array. */
const char **mz_l_strarray(lua_State *L, int anchors, int n);

#endif
