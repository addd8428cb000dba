/*
 * l_wait.c - the wait binding of `mirza.core`: the per-state context (the
 * curl multi client, kept in the registry and freed by its __gc), the
 * interrupt flag a signal handler raises, wait/sleep/ready/now, the
 * scheduler's task hook and the stream map mirza.ready hands out.
 *
 * File-scope state is limited to what a signal handler must reach: the
 * flag and the client of the first (main) state to wake it.
 */
#include "l_wait.h"

#include <limits.h>
#include <math.h>
#include <lauxlib.h>

#include "host.h"
#include "l_util.h"

#define CTX_KEY "mirza.ctx"

static volatile sig_atomic_t interrupt_pending, interrupt_seen;
static mz_client *volatile signal_client;

void mz_l_signal(void) {
  interrupt_pending = 1;
  interrupt_seen = 1;
  mz_client *c = signal_client;
  if (c) mz_client_wakeup(c);
}

int mz_l_was_interrupted(void) { return interrupt_seen; }

/* The host's handler (MZ_HOST_ON_INTERRUPT) has its word first: the
 * `mirza` host ends the process there on a second signal, so a pcall in
 * the script cannot catch that one. */
int mz_l_raise_interrupt(lua_State *L) {
  interrupt_pending = 0;
  if (lua_getfield(L, LUA_REGISTRYINDEX, MZ_HOST_ON_INTERRUPT) == LUA_TFUNCTION) lua_call(L, 0, 0);
  else lua_pop(L, 1);
  return luaL_error(L, "interrupted");
}

/* A signal cut a wait short without the host's flag: under stock lua5.4
 * its SIGINT handler has set a hook on the main thread that raises
 * "interrupted!" at the next Lua instruction. One call of an empty Lua
 * chunk makes that hook run here (on a coroutine, with the main thread's
 * hook copied to it first), so the error unwinds through the wait and the
 * script's <close> variables and for loops close their streams. Returns
 * when no hook raised (another signal): the caller waits again. */
void mz_l_after_signal(lua_State *L) {
  lua_Hook h = lua_gethook(L);
  if (!h) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    lua_State *main = lua_tothread(L, -1);
    lua_pop(L, 1);
    if (!main || main == L || !(h = lua_gethook(main))) return;
    lua_sethook(L, h, lua_gethookmask(main), lua_gethookcount(main));
  }
  if (luaL_loadbuffer(L, "return", 6, "=(mirza: a signal during a wait)") == LUA_OK) lua_call(L, 0, 0);
  else lua_pop(L, 1);
}

/* Milliseconds left until `end` (mz_now() seconds; INFINITY: -1). */
long mz_l_left_ms(double end) {
  if (isinf(end)) return -1;
  double left = (end - mz_now()) * 1000.0;
  return left > 0 ? (long)ceil(left) : 0;
}

double mz_l_end_of(long ms) { return ms < 0 ? INFINITY : mz_now() + (double)ms / 1000.0; }

static int ctx_gc(lua_State *L) {
  mz_ctx *ctx = lua_touserdata(L, 1);
  if (ctx->client) {
    if (signal_client == ctx->client) signal_client = NULL;
    mz_client_free(ctx->client); /* cancels every transfer still open */
    ctx->client = NULL;
  }
  return 0;
}

void mz_l_pushctx(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, CTX_KEY) == LUA_TUSERDATA) return;
  lua_pop(L, 1);
  mz_ctx *ctx = lua_newuserdatauv(L, sizeof *ctx, 0);
  ctx->client = NULL;
  ctx->warned_plain = 0;
  ctx->in_task = 0;
  ctx->slice = 0;
  ctx->slice_max = 64;
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, ctx_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  if (!(ctx->client = mz_client_new(&interrupt_pending))) luaL_error(L, "mirza: cannot initialise libcurl");
  if (!signal_client) signal_client = ctx->client;
  static const char *const names[MZ_STR_N] = {"text", "type", "think", "deltas", "index"};
  for (int i = 0; i < MZ_STR_N; i++) {
    lua_pushstring(L, names[i]);
    ctx->str[i] = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, CTX_KEY);
}

mz_ctx *mz_l_ctx(lua_State *L) {
  mz_l_pushctx(L);
  mz_ctx *ctx = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!ctx->client) luaL_error(L, "mirza: the state is closing");
  return ctx;
}

/* mirza.wait([timeout]) -> number of streams with events ready (0 on
 * timeout). Drives every open transfer; never yields. */
static int l_wait(lua_State *L) {
  mz_ctx *ctx = mz_l_ctx(L);
  double end = mz_l_end_of(mz_l_opt_ms(L, 1));
  int n;
  while ((n = mz_client_wait(ctx->client, mz_l_left_ms(end))) == MZ_NEXT_SIGNAL) mz_l_after_signal(L);
  if (n == MZ_NEXT_INTERRUPTED) return mz_l_raise_interrupt(L);
  lua_pushinteger(L, n);
  return 1;
}

static int slept(lua_State *L, int status, lua_KContext k) {
  (void)L, (void)status, (void)k;
  return 0;
}

/* mirza.sleep(seconds): transfers keep flowing meanwhile. Inside a task
 * the scheduler sleeps instead (other tasks run meanwhile). */
static int l_sleep(lua_State *L) {
  mz_ctx *ctx = mz_l_ctx(L);
  long ms = mz_l_opt_ms(L, 1);
  luaL_argcheck(L, ms >= 0, 1, "number expected");
  if (mz_l_in_task(L, ctx)) {
    lua_settop(L, 1);
    mz_l_push_hook(L);
    lua_pushliteral(L, "sleep");
    lua_pushvalue(L, 1);
    lua_callk(L, 2, 0, 0, slept); /* yields: no curl frame below us */
    return 0;
  }
  double end = mz_l_end_of(ms);
  int rc;
  while ((rc = mz_client_sleep(ctx->client, mz_l_left_ms(end))) == MZ_NEXT_SIGNAL) mz_l_after_signal(L);
  if (rc == MZ_NEXT_INTERRUPTED) return mz_l_raise_interrupt(L);
  return 0;
}

/* ---- tasks --------------------------------------------------------------
 * A scheduler (mirza.loop) tells the core when it resumes one of its tasks;
 * inside one, a pull with nothing to take and a sleep call the hook (kept
 * in the registry) with ("wait", stream, seconds|nil) -> why,
 * ("turn") (the task took slice_max events in a row: others first) or
 * ("sleep", seconds), all three yielding to the scheduler; ("open",
 * stream) when the task opens one and ("closed", stream) when a stream a
 * task waits on is closed, neither yielding. Nothing is replaced: outside
 * a task every function behaves as if no scheduler existed. */
static const char hook_key = 0;

int mz_l_push_hook(lua_State *L) { return lua_rawgetp(L, LUA_REGISTRYINDEX, &hook_key); }

/* mirza.core.task(hook|false [, slice]) -> the previous hook, or false:
 * a scheduler calls it with its hook before it resumes a task and with
 * what it returned after. slice (default 64): events a task may take in
 * a row before the other tasks run. */
static int l_task(lua_State *L) {
  mz_ctx *ctx = mz_l_ctx(L);
  int on = lua_toboolean(L, 1);
  if (on) luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_Number slice = luaL_optnumber(L, 2, 64);
  if (ctx->in_task) mz_l_push_hook(L);
  else lua_pushboolean(L, 0);
  if (on) {
    lua_pushvalue(L, 1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &hook_key); /* kept after: a close outside a task wakes its waiter */
  }
  ctx->in_task = on;
  ctx->slice = 0;
  ctx->slice_max = !(slice < (lua_Number)LONG_MAX) ? LONG_MAX : slice < 1 ? 1 : (long)slice;
  return 1;
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, mz_now());
  return 1;
}

/* ---- ready streams ------------------------------------------------------
 * mirza.ready() hands out the Stream userdata of the client's ready list.
 * A weak-valued registry table maps each open mz_stream (light userdata) to
 * its userdata; l_stream.c registers every stream it opens. */
#define STREAMS_KEY "mirza.streams"

static void push_stream_map(lua_State *L) { mz_l_weak_table(L, STREAMS_KEY, "v"); }

void mz_l_stream_opened(lua_State *L, mz_stream *s, int idx) {
  idx = lua_absindex(L, idx);
  push_stream_map(L); /* [map] */
  lua_pushlightuserdata(L, s);
  lua_pushvalue(L, idx);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

/* mirza.ready([timeout [, list]]) -> list, n: the streams that got events
 * since the last call (each once), waiting up to timeout for news (nil:
 * until some, or until nothing runs; each stream read as client.c's rule
 * says). list (reused when given) holds them in [1..n]; entries past n
 * are cleared. Never yields. */
static int l_ready(lua_State *L) {
  mz_ctx *ctx = mz_l_ctx(L);
  long ms = mz_l_opt_ms(L, 1);
  lua_settop(L, 2);
  if (lua_isnil(L, 2)) {
    lua_newtable(L);
  } else {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_pushvalue(L, 2);
  }
  int out = lua_gettop(L), rc = 0;
  double end = mz_l_end_of(ms);
  while ((rc = mz_client_wait_ready(ctx->client, mz_l_left_ms(end))) == MZ_NEXT_SIGNAL) mz_l_after_signal(L);
  if (rc == MZ_NEXT_INTERRUPTED) return mz_l_raise_interrupt(L);
  push_stream_map(L); /* [list, map] */
  mz_stream *batch[64];
  lua_Integer n = 0;
  size_t got;
  while ((got = mz_client_ready(ctx->client, batch, 64)) > 0)
    for (size_t i = 0; i < got; i++) {
      lua_pushlightuserdata(L, batch[i]);
      if (lua_rawget(L, -2) == LUA_TNIL) lua_pop(L, 1); /* being collected: closing */
      else lua_rawseti(L, out, ++n);
    }
  for (lua_Integer i = n + 1; lua_rawgeti(L, out, i) != LUA_TNIL; i++) {
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_rawseti(L, out, i);
  }
  lua_settop(L, out);
  lua_pushinteger(L, n);
  return 2;
}

static int l_streams(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)mz_client_streams(mz_l_ctx(L)->client));
  return 1;
}

void mz_l_wait_funcs(lua_State *L) {
  static const luaL_Reg funcs[] = {{"wait", l_wait},   {"sleep", l_sleep}, {"now", l_now}, {"streams", l_streams},
                                   {"ready", l_ready}, {"task", l_task},   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
