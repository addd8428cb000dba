/*
 * l_util.h - helpers shared by the binding files (l_*.c): the one way to
 * return an expected failure, `nil, message, code`; a timeout argument;
 * the checks of an options table (unknown keys, numbers named by their
 * option); a userdata's metatable.
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

/* The timeout argument at idx in seconds, as milliseconds: -1 (forever)
 * when absent or nil or over 1e9 s. Raises on a negative or a non-number
 * ("bad argument #idx ... (negative timeout)"). */
long mz_l_opt_ms(lua_State *L, int idx);

/* Raise "<who>: unknown option 'k'" for a key of the table at idx that is
 * not in keys (NULL-terminated). */
void mz_l_check_keys(lua_State *L, int idx, const char *const *keys, const char *who);

/* A number read from an options table, and what it must be. */
typedef struct mz_l_option {
  const char *who;      /* "mirza.open" */
  const char *key;      /* "max_event_bytes" */
  const char *expected; /* "a positive integer (bytes)" */
  lua_Number lo, hi;    /* the accepted range, both included */
  int integer;          /* only integral values (2.0 and "2" are) */
} mz_l_option;

/* The value at vidx as o describes it; anything else raises
 * "<who>: '<key>' must be <expected> (got <value>)". */
lua_Number mz_l_check_option(lua_State *L, int vidx, const mz_l_option *o);
/* The same for the field o->key of the table at idx; def when it is nil. */
lua_Number mz_l_opt_field(lua_State *L, int idx, const mz_l_option *o, lua_Number def);

/* Create the metatable `name` once: the meta functions, and __index a
 * table of the methods (both NULL-terminated). Pushes nothing. */
void mz_l_newclass(lua_State *L, const char *name, const luaL_Reg *meta, const luaL_Reg *methods);

/* Push the registry's table `key`, made on first use with weak keys or
 * values (mode "k" or "v"). */
void mz_l_weak_table(lua_State *L, const char *key, const char *mode);

#endif
