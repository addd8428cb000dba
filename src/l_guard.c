/*
 * l_guard.c - mirza.core.guard(thresholds): the repetition guard's rules
 * (guard.c) as a Lua object, for the policy mirza.repetition, which gives
 * the thresholds and makes it a pipeline stage.
 *
 *   local g <close> = core.guard(thresholds)   -- every key of repetition.DEFAULTS
 *   local hit, line, count, rule = g:feed(delta)
 *   local hit, line, count, rule = g:check(text)  -- the text's end: the rest judged
 *   g.triggered, g.line, g.count, g.rule         -- the report
 *
 * Built like liolib's files: the userdata is created closed, then the
 * guard is allocated; close, __close and __gc are one idempotent function,
 * and a method or a field of a closed guard raises. A call that runs out
 * of memory raises (the guard is then closed: its verdicts would be wrong).
 */
#include <lauxlib.h>
#include <string.h>

#include "guard.h"
#include "l_core.h"
#include "l_util.h"

#define GUARD_MT "mirza.RepetitionGuard"

typedef struct lguard {
  mz_guard *g; /* NULL: closed */
} lguard;

static mz_guard *check_open(lua_State *L) {
  lguard *u = luaL_checkudata(L, 1, GUARD_MT);
  if (!u->g) luaL_error(L, "attempt to use a closed repetition guard");
  return u->g;
}

/* check_open for the hot methods: the metatable compared with the one
 * they hold as upvalue 1 (luaL_checkudata looks its name up each time). */
static mz_guard *fast_open(lua_State *L) {
  lguard *u = lua_touserdata(L, 1);
  int ok = u && lua_getmetatable(L, 1);
  if (ok) {
    ok = lua_rawequal(L, -1, lua_upvalueindex(1));
    lua_pop(L, 1);
  }
  if (!ok || !u->g) return check_open(L); /* raises */
  return u->g;
}

static int guard_close(lua_State *L) {
  lguard *u = luaL_checkudata(L, 1, GUARD_MT);
  mz_guard_free(u->g);
  u->g = NULL;
  return 0;
}

static int guard_closed(lua_State *L) {
  lua_pushboolean(L, ((lguard *)luaL_checkudata(L, 1, GUARD_MT))->g == NULL);
  return 1;
}

static int guard_tostring(lua_State *L) {
  lguard *u = luaL_checkudata(L, 1, GUARD_MT);
  const char *rule = u->g ? mz_guard_rule_name(mz_guard_rule_of(u->g)) : NULL;
  if (!u->g) lua_pushliteral(L, "mirza.RepetitionGuard (closed)");
  else if (rule) lua_pushfstring(L, "mirza.RepetitionGuard (triggered: %s)", rule);
  else lua_pushliteral(L, "mirza.RepetitionGuard (watching)");
  return 1;
}

/* triggered [, line, count, rule]: the values a feed returns. */
static int push_report(lua_State *L, const mz_guard *g) {
  const char *rule = mz_guard_rule_name(mz_guard_rule_of(g));
  lua_pushboolean(L, rule != NULL);
  if (!rule) return 1;
  size_t len;
  const char *line = mz_guard_line(g, &len);
  lua_pushlstring(L, line, len);
  lua_pushinteger(L, mz_guard_count(g));
  lua_pushstring(L, rule);
  return 4;
}

static int feed_with(lua_State *L, int (*fn)(mz_guard *, const char *, size_t)) {
  mz_guard *g = fast_open(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  if (fn(g, s, n) < 0) {
    guard_close(L);
    return luaL_error(L, "not enough memory");
  }
  return push_report(L, g);
}

/* g:feed(text) -> triggered [, line, count, rule] */
static int guard_feed(lua_State *L) { return feed_with(L, mz_guard_feed); }

/* g:check(text) -> the same, the text's end reached: what is left judged. */
static int guard_check(lua_State *L) { return feed_with(L, mz_guard_check); }

/* The methods (upvalue 1), then the report's fields. */
static int guard_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  const mz_guard *g = check_open(L);
  const char *k = lua_tostring(L, 2);
  const char *rule = mz_guard_rule_name(mz_guard_rule_of(g));
  if (!k) return 0;
  if (strcmp(k, "triggered") == 0) {
    lua_pushboolean(L, rule != NULL);
  } else if (!rule) {
    return 0;
  } else if (strcmp(k, "rule") == 0) {
    lua_pushstring(L, rule);
  } else if (strcmp(k, "line") == 0) {
    size_t len;
    const char *line = mz_guard_line(g, &len);
    lua_pushlstring(L, line, len);
  } else if (strcmp(k, "count") == 0) {
    lua_pushinteger(L, mz_guard_count(g));
  } else {
    return 0;
  }
  return 1;
}

#define N_THRESHOLDS 10

int mz_l_guard(lua_State *L) {
  /* in the order of mz_guard_opts' fields */
  static const char *const keys[N_THRESHOLDS + 1] = {
      "repeats",    "max_cycle",          "count",        "window", "min_letters", "phrase_repeats", "phrase_min_chars",
      "max_phrase", "phrase_min_letters", "line_repeats", NULL};
  static const luaL_Reg meta[] = {
      {"__gc", guard_close}, {"__close", guard_close}, {"__tostring", guard_tostring}, {NULL, NULL}};
  static const luaL_Reg methods[] = {
      {"feed", guard_feed}, {"check", guard_check}, {"close", guard_close}, {"closed", guard_closed}, {NULL, NULL}};
  luaL_checktype(L, 1, LUA_TTABLE);
  mz_l_check_keys(L, 1, keys, "mirza.repetition");
  double v[N_THRESHOLDS];
  for (int i = 0; i < N_THRESHOLDS; i++) { /* each a count, but a unit's bytes */
    mz_l_option o = {"mirza.repetition", keys[i], "a number from 0 to 1e6", 0, 1e6, 0};
    if (strcmp(keys[i], "max_phrase") == 0) o.expected = "a number from 0 to 4096 (bytes)", o.hi = 4096;
    lua_getfield(L, 1, keys[i]);
    v[i] = mz_l_check_option(L, -1, &o);
    lua_pop(L, 1);
  }
  mz_guard_opts o = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]};
  if (luaL_newmetatable(L, GUARD_MT)) {
    luaL_setfuncs(L, meta, 0);
    lua_createtable(L, 0, 4);
    lua_pushvalue(L, -2);
    luaL_setfuncs(L, methods, 1); /* each with the metatable (fast_open) */
    lua_pushcclosure(L, guard_index, 1);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lguard *u = lua_newuserdatauv(L, sizeof *u, 0); /* created closed */
  u->g = NULL;
  luaL_setmetatable(L, GUARD_MT);
  u->g = mz_guard_new(&o);
  if (!u->g) return luaL_error(L, "not enough memory");
  return 1;
}
