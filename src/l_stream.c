/*
 * l_stream.c - the mirza.Stream userdata: one HTTP request to a daemon and
 * its events, pulled with s:next(timeout) or `for ev in s:events() do`.
 *
 * Built like liolib's files: the userdata is created closed, then the
 * request is opened; close(), __close and __gc are one idempotent
 * function, and closing a running transfer cancels it (the connection is
 * dropped, so the daemon stops generating). The events() iterator returns
 * the stream as its closing value: `break` or an error in the loop body
 * tears the transfer down.
 */
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "l_stream.h"
#include "l_wait.h"
#include "l_json.h"
#include "l_util.h"
#include "mirza.h"

typedef struct lstream {
  mz_stream *s;    /* NULL when closed */
  mz_ctx *ctx;     /* kept alive by uservalue 1 */
  int awaited;     /* a task waits on it through the scheduler's hook */
  double first_at; /* the stream's first delta, kept when it closes (first_at) */
} lstream;

static lstream *to_stream(lua_State *L, int idx) { return luaL_checkudata(L, idx, MZ_STREAM_MT); }

static lstream *check_stream(lua_State *L, int idx) {
  lstream *u = to_stream(L, idx);
  if (!u->s) luaL_error(L, "attempt to use a closed stream");
  return u;
}

/* ------------------------------------------------------------ events */

static const char *const type_names[] = {
    [MZ_EV_THINK] = "think",       [MZ_EV_TEXT] = "text",           [MZ_EV_TOOL_CALL] = "tool_call",
    [MZ_EV_PROGRESS] = "progress", [MZ_EV_HEARTBEAT] = "heartbeat", [MZ_EV_DONE] = "done",
    [MZ_EV_ERROR] = "error",       [MZ_EV_RESPONSE] = "response"};

/* Copy the fields of a JSON object into the table on top (nulls left out). */
static void merge_fields(lua_State *L, const cJSON *obj) {
  for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) {
    if (!it->string || cJSON_IsNull(it)) continue;
    mz_l_pushjson(L, it, 1);
    lua_setfield(L, -2, it->string);
  }
}

static void set_string(lua_State *L, const char *k, const char *v, size_t len) {
  lua_pushlstring(L, v, len);
  lua_setfield(L, -2, k);
}

/* ev.headers = {name = value} from "name: value\n" lines (names already
 * in lowercase); a repeated header's values are joined with ", ". */
static void push_headers(lua_State *L, const char *h, size_t len) {
  const char *end = h + len;
  int lines = 0;
  for (const char *p = h; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++) lines++;
  lua_createtable(L, 0, lines); /* [ev, headers]: a slot per line (a repeated name takes one) */
  while (h && h < end) {
    const char *nl = memchr(h, '\n', (size_t)(end - h)), *colon = memchr(h, ':', (size_t)(nl - h));
    const char *v = colon + 1;
    while (v < nl && (*v == ' ' || *v == '\t')) v++;
    lua_pushlstring(L, h, (size_t)(colon - h)); /* [ev, headers, name] */
    if (lua_rawget(L, -2) == LUA_TSTRING) {     /* [ev, headers, old] */
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, v, (size_t)(nl - v));
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, v, (size_t)(nl - v));
    }
    lua_pushlstring(L, h, (size_t)(colon - h)); /* [ev, headers, value, name] */
    lua_insert(L, -2);
    lua_rawset(L, -3);
    h = nl + 1;
  }
  lua_setfield(L, -2, "headers");
}

static void push_error(lua_State *L, const mz_event *e) {
  set_string(L, "message", e->text, e->len);
  lua_pushstring(L, e->code);
  lua_setfield(L, -2, "code");
  if (e->status) {
    lua_pushinteger(L, e->status);
    lua_setfield(L, -2, "status");
  }
  if (e->json) { /* the server's error object (or whole error body) */
    mz_l_pushjson(L, e->json, 1);
    lua_setfield(L, -2, "error");
  }
  if (e->body && e->body_len && e->code && strcmp(e->code, MZ_E_HTTP) == 0) set_string(L, "body", e->body, e->body_len);
  if (e->headers_len) push_headers(L, e->headers, e->headers_len);
  if (e->retry_after >= 0) {
    lua_pushinteger(L, (lua_Integer)e->retry_after);
    lua_setfield(L, -2, "retry_after");
  }
}

static void push_str(lua_State *L, const mz_ctx *ctx, int which) { lua_rawgeti(L, LUA_REGISTRYINDEX, ctx->str[which]); }

/* A think or text delta: {type =, text = [, deltas =] [, index =]}, the
 * hot path (the table sized exactly: less for the GC to walk). */
static void push_delta(lua_State *L, const mz_ctx *ctx, const mz_event *e) {
  lua_createtable(L, 0, 2 + (e->index != 0) + (e->deltas > 1));
  push_str(L, ctx, MZ_STR_TEXT);
  lua_pushlstring(L, e->text, e->len);
  lua_rawset(L, -3);
  if (e->deltas > 1) {
    push_str(L, ctx, MZ_STR_DELTAS);
    lua_pushinteger(L, (lua_Integer)e->deltas);
    lua_rawset(L, -3);
  }
  if (e->index) {
    push_str(L, ctx, MZ_STR_INDEX);
    lua_pushinteger(L, e->index);
    lua_rawset(L, -3);
  }
  push_str(L, ctx, MZ_STR_TYPE);
  push_str(L, ctx, e->type == MZ_EV_THINK ? MZ_STR_THINK : MZ_STR_TEXT);
  lua_rawset(L, -3);
}

/* The event as a plain table: {type = ..., ...}. */
static void push_event(lua_State *L, const mz_ctx *ctx, const mz_event *e) {
  if (e->type == MZ_EV_THINK || e->type == MZ_EV_TEXT) {
    push_delta(L, ctx, e);
    return;
  }
  /* sized for what goes in (the frames' fields, type, index, headers):
   * an event built key by key would be rehashed as it grows */
  int n = 1 + (e->index != 0);
  if (e->type == MZ_EV_PROGRESS || e->type == MZ_EV_HEARTBEAT || e->type == MZ_EV_DONE)
    n += mz_l_json_members(e->json, 1);
  else n += 4;
  n += e->headers_len != 0;
  lua_createtable(L, 0, n);
  switch (e->type) {
  case MZ_EV_THINK:
  case MZ_EV_TEXT: break; /* push_delta */
  case MZ_EV_TOOL_CALL:
    mz_l_pushjson(L, e->json, 1);
    lua_setfield(L, -2, "calls");
    break;
  case MZ_EV_PROGRESS:
  case MZ_EV_HEARTBEAT: merge_fields(L, e->json); break;
  case MZ_EV_DONE: /* the frames' fields, then the response headers (x-request-id) */
    merge_fields(L, e->json);
    if (e->headers_len) push_headers(L, e->headers, e->headers_len);
    break;
  case MZ_EV_ERROR: push_error(L, e); break;
  case MZ_EV_RESPONSE:
    set_string(L, "body", e->text, e->len);
    lua_pushinteger(L, e->status);
    lua_setfield(L, -2, "status");
    if (e->headers_len) push_headers(L, e->headers, e->headers_len);
    break;
  }
  if (e->index) {
    lua_pushinteger(L, e->index);
    lua_setfield(L, -2, "index");
  }
  lua_pushstring(L, type_names[e->type]); /* last: a server field "type" must not win */
  lua_setfield(L, -2, "type");
}

/* ------------------------------------------------------------ methods */

/* What a chunks() pull gives: the kind and, for a think or text delta,
 * its text (no table: nothing else to collect), else the event table. */
static int push_chunk(lua_State *L, const mz_ctx *ctx, const mz_event *e) {
  if (e->type == MZ_EV_THINK || e->type == MZ_EV_TEXT) {
    push_str(L, ctx, e->type == MZ_EV_THINK ? MZ_STR_THINK : MZ_STR_TEXT);
    lua_pushlstring(L, e->text, e->len);
    return 2;
  }
  lua_pushstring(L, type_names[e->type]);
  push_event(L, ctx, e);
  return 2;
}

/* Shared by next() and the events() and chunks() iterators (chunk: the
 * chunks() form). Returns the number of Lua results. */
static int pull_as(lua_State *L, lstream *u, long ms, int chunk) {
  const mz_event *e;
  int rc;
  double end = ms > 0 ? mz_l_end_of(ms) : 0;
  while ((rc = mz_stream_next(u->s, ms, &e)) == MZ_NEXT_SIGNAL) {
    mz_l_after_signal(L); /* stock lua5.4's Ctrl-C raises here */
    if (!u->s) return luaL_error(L, "attempt to use a closed stream");
    if (ms > 0) ms = mz_l_left_ms(end);
  }
  switch (rc) {
  case MZ_NEXT_EVENT:
    if (chunk) return push_chunk(L, u->ctx, e);
    push_event(L, u->ctx, e);
    return 1;
  case MZ_NEXT_TIMEOUT: return mz_l_fail(L, "timeout", MZ_E_TIMEOUT);
  case MZ_NEXT_INTERRUPTED: return mz_l_raise_interrupt(L);
  default: /* MZ_NEXT_END */ lua_pushnil(L); return 1;
  }
}

static int pull(lua_State *L, lstream *u, long ms) { return pull_as(L, u, ms, 0); }

/* ------------------------------------------------------------ in a task
 * Inside a scheduler's task (mz_l_in_task) a pull never blocks: when the
 * stream has nothing to take it calls the scheduler's hook, which
 * suspends the task until the stream has news (or the timeout), and takes
 * up again in the continuation. The yield happens in the hook, in Lua,
 * with no libcurl frame on the C stack (mz_stream_next has returned).
 * Stack of a cooperative pull: the call's arguments at 1..3 (next_batch's
 * max at 3), the stream at CO_STREAM, the deadline (mz_now() seconds, -1:
 * none) at CO_END. */
enum { OP_NEXT, OP_BATCH, OP_CHUNK };
#define CO_STREAM 4
#define CO_END 5

static int batch(lua_State *L, lstream *u, long ms, lua_Integer max);

static int has_news(const lstream *u) { return mz_stream_pending(u->s) || mz_stream_finished(u->s); }

static int take(lua_State *L, lstream *u, int op) {
  return op == OP_BATCH ? batch(L, u, 0, luaL_optinteger(L, 3, 0)) : pull_as(L, u, 0, op == OP_CHUNK);
}

static int coop_step(lua_State *L, lstream *u, int op);

/* The task was resumed: the hook's answer (why it woke) on top. */
static int coop_resumed(lua_State *L, int status, lua_KContext op) {
  (void)status;
  lstream *u = lua_touserdata(L, CO_STREAM);
  int timer = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "timer") == 0;
  lua_settop(L, CO_END);
  u->awaited = 0;
  if (timer && u->s && !has_news(u)) return mz_l_fail(L, "timeout", MZ_E_TIMEOUT);
  return coop_step(L, u, (int)op);
}

/* Take what is there (after slice_max events in a row, let the other
 * tasks run first), else hand the wait to the scheduler. */
static int coop_step(lua_State *L, lstream *u, int op) {
  mz_ctx *ctx = u->ctx;
  if (!u->s) return luaL_error(L, "attempt to use a closed stream");
  if (has_news(u)) {
    if (++ctx->slice <= ctx->slice_max) return take(L, u, op);
    ctx->slice = 0;
    mz_l_push_hook(L);
    lua_pushliteral(L, "turn");
    lua_callk(L, 1, 1, op, coop_resumed);
    return coop_resumed(L, LUA_OK, op);
  }
  ctx->slice = 0;
  lua_Number end = lua_tonumber(L, CO_END), left = end < 0 ? -1 : end - mz_now();
  if (end >= 0 && left <= 0) return take(L, u, op); /* polls once more */
  u->awaited = 1;
  mz_l_push_hook(L);
  lua_pushliteral(L, "wait");
  lua_pushvalue(L, CO_STREAM);
  if (left >= 0) lua_pushnumber(L, left);
  else lua_pushnil(L);
  lua_callk(L, 3, 1, op, coop_resumed);
  return coop_resumed(L, LUA_OK, op);
}

/* A pull in a task: the stream is at CO_STREAM already. */
static int coop(lua_State *L, lstream *u, long ms, int op) {
  lua_pushnumber(L, ms < 0 ? -1 : mz_now() + (double)ms / 1000.0); /* CO_END */
  return coop_step(L, u, op);
}

/* s:next([timeout]) -> event | nil (ended) | nil, "timeout", "timeout" */
static int s_next(lua_State *L) {
  lstream *u = check_stream(L, 1);
  long ms = mz_l_opt_ms(L, 2);
  if (!mz_l_in_task(L, u->ctx)) return pull(L, u, ms);
  lua_settop(L, 3);
  lua_pushvalue(L, 1); /* CO_STREAM */
  return coop(L, u, ms, OP_NEXT);
}

/*
 * s:next_batch([timeout [, max]]) -> {event, ...} | nil (ended) | nil,
 * "timeout", "timeout". Waits like next() for the first event, then takes
 * every event already queued behind it (up to max, default all) without
 * driving the transfers again: the frames that arrived in one read cost
 * one call. The terminal event, when queued, is the batch's last element.
 */
static int s_next_batch(lua_State *L) {
  lstream *u = check_stream(L, 1);
  long ms = mz_l_opt_ms(L, 2);
  lua_Integer max = luaL_optinteger(L, 3, 0);
  luaL_argcheck(L, max >= 0, 3, "negative count");
  if (!mz_l_in_task(L, u->ctx)) return batch(L, u, ms, max);
  lua_settop(L, 3);
  lua_pushvalue(L, 1); /* CO_STREAM */
  return coop(L, u, ms, OP_BATCH);
}

static int batch(lua_State *L, lstream *u, long ms, lua_Integer max) {
  size_t n = mz_stream_pending(u->s);
  if (max && n > (size_t)max) n = (size_t)max;
  lua_createtable(L, n ? (int)(n < 4096 ? n : 4096) : 1, 0); /* [s, timeout, max, batch] */
  int got = pull(L, u, ms);
  if (got != 1 || lua_isnil(L, -1)) return got; /* the end, or nil, msg, code */
  lua_rawseti(L, -2, 1);
  lua_Integer i = 1;
  const mz_event *e;
  while ((!max || i < max) && mz_stream_pending(u->s) && mz_stream_next(u->s, 0, &e) == MZ_NEXT_EVENT) {
    push_event(L, u->ctx, e);
    lua_rawseti(L, -2, ++i);
  }
  return 1;
}

/* The iterator holds its stream as upvalue 1 (no metatable check per
 * event); the state argument the for loop passes is that same stream. */
static int iter_pull(lua_State *L, int op) {
  lstream *u = lua_touserdata(L, lua_upvalueindex(1));
  if (!u->s) return luaL_error(L, "attempt to use a closed stream");
  if (!mz_l_in_task(L, u->ctx)) return pull_as(L, u, -1, op == OP_CHUNK);
  lua_settop(L, 3);
  lua_pushvalue(L, lua_upvalueindex(1)); /* CO_STREAM */
  return coop(L, u, -1, op);
}

static int events_iter(lua_State *L) { return iter_pull(L, OP_NEXT); }
static int chunks_iter(lua_State *L) { return iter_pull(L, OP_CHUNK); } /* kind, text: push_chunk */

/* The four values of a generic for over iter (the stream closes the loop). */
static int iterate(lua_State *L, lua_CFunction iter) {
  check_stream(L, 1);
  lua_pushvalue(L, 1);
  lua_pushcclosure(L, iter, 1);
  lua_pushvalue(L, 1);
  lua_pushnil(L);
  lua_pushvalue(L, 1);
  return 4;
}

/* for ev in s:events() do ... end */
static int s_events(lua_State *L) { return iterate(L, events_iter); }

/* for kind, x in s:chunks() do ... end: x is the text of a think or text
 * delta, the event table of any other kind. */
static int s_chunks(lua_State *L) { return iterate(L, chunks_iter); }

static int s_gc(lua_State *L) {
  lstream *u = to_stream(L, 1);
  if (u->s) {
    if (u->ctx->client) { /* else freed with the client (nothing to read) */
      u->first_at = mz_stream_first_at(u->s);
      mz_stream_close(u->s);
    }
    u->s = NULL;
  }
  return 0;
}

/* close() and __close also wake a task waiting on the stream (its pull
 * then raises "attempt to use a closed stream", as it would outside). */
static int s_close(lua_State *L) {
  lstream *u = to_stream(L, 1);
  s_gc(L);
  if (u->awaited) {
    u->awaited = 0;
    if (mz_l_push_hook(L) == LUA_TFUNCTION) {
      lua_pushliteral(L, "closed");
      lua_pushvalue(L, 1);
      lua_call(L, 2, 0);
    }
  }
  return 0;
}

static int s_pending(lua_State *L) {
  lstream *u = check_stream(L, 1);
  lua_pushinteger(L, (lua_Integer)mz_stream_pending(u->s));
  return 1;
}

static int s_finished(lua_State *L) {
  lstream *u = check_stream(L, 1);
  lua_pushboolean(L, mz_stream_finished(u->s));
  return 1;
}

/* s:first_at() -> when the first think or text delta was read
 * (mirza.now() seconds), or nil: a time to first token that `hold` does
 * not delay. Also once closed (an events() loop closes at the end). */
static int s_first_at(lua_State *L) {
  lstream *u = to_stream(L, 1);
  double t = u->s ? mz_stream_first_at(u->s) : u->first_at;
  if (t > 0) lua_pushnumber(L, t);
  else lua_pushnil(L);
  return 1;
}

/* s:step() -> with `step`, the time from the first delta to the next
 * read (seconds), or nil before it. */
static int s_step(lua_State *L) {
  lstream *u = check_stream(L, 1);
  double t = mz_stream_step(u->s);
  if (t > 0) lua_pushnumber(L, t);
  else lua_pushnil(L);
  return 1;
}

static int s_closed(lua_State *L) {
  lua_pushboolean(L, to_stream(L, 1)->s == NULL);
  return 1;
}

static int s_tostring(lua_State *L) {
  lstream *u = to_stream(L, 1);
  if (u->s) lua_pushfstring(L, "mirza.Stream (%p)", (void *)u);
  else lua_pushliteral(L, "mirza.Stream (closed)");
  return 1;
}

/* ------------------------------------------------------------ open */

static const char *const request_keys[] = {
    "url",    "body",  "headers",        "api_key",      "timeout",     "stall_timeout", "deadline", "max_event_bytes",
    "method", "plain", "header_timeout", "on_bad_frame", "record_file", "merge",         "hold",     "step",
    NULL};

/* The default clocks of mirza.open (and so of collect, request, the engine
 * and batch), in seconds: nothing waits forever unless told to with
 * `false`. They fill `mirza.defaults` (upvalue 1 of open), which a script
 * may change for every later request. */
static const struct {
  const char *name;
  lua_Integer s;
} default_clocks[] = {
    {"timeout", 10},         /* TCP connect */
    {"header_timeout", 600}, /* until the whole head: long prefills, queued requests */
    {"stall_timeout", 120},  /* silence once the response began */
};

/* 0 (the default cap, 4 MiB) is asked for by leaving the option out. */
static const mz_l_option max_event_bytes = {"mirza.open",
                                            "max_event_bytes",
                                            "a positive integer (bytes)",
                                            1,
                                            (lua_Number)(SIZE_MAX / 2 < LUA_MAXINTEGER ? SIZE_MAX / 2 : LUA_MAXINTEGER),
                                            1};

/* A clock option in seconds -> ms: nil takes mirza.defaults[k] (nil there:
 * 0, the C default), false `off`. */
static long field_ms(lua_State *L, int idx, const char *k, long off) {
  long ms = 0;
  int t = lua_getfield(L, idx, k);
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    t = lua_getfield(L, lua_upvalueindex(1), k);
  }
  if (t == LUA_TBOOLEAN && !lua_toboolean(L, -1)) {
    ms = off;
  } else if (t != LUA_TNIL) {
    const mz_l_option o = {"mirza.open", k, "a non-negative number of seconds, or false for none", 0, HUGE_VAL, 0};
    lua_Number v = mz_l_check_option(L, -1, &o);
    ms = v > 2e9 ? 2000000000L : (long)(v * 1000.0 + 0.5);
    if (v > 0 && ms == 0) ms = 1;
  }
  lua_pop(L, 1);
  return ms;
}

/* `hold` as field_ms, except math.huge: to the end (LONG_MAX, which
 * queue.c reads as such: nothing handed over before the end), not the
 * 2e9 ms every other huge number is. */
static long field_hold_ms(lua_State *L, int idx) {
  int t = lua_getfield(L, idx, "hold");
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    t = lua_getfield(L, lua_upvalueindex(1), "hold"); /* mirza.defaults */
  }
  int to_end = t == LUA_TNUMBER && isinf(lua_tonumber(L, -1)) && lua_tonumber(L, -1) > 0;
  lua_pop(L, 1);
  return to_end ? LONG_MAX : field_ms(L, idx, "hold", 0);
}

static const char *field_str(lua_State *L, int idx, const char *k, size_t *len) {
  int t = lua_getfield(L, idx, k);
  if (t != LUA_TNIL && t != LUA_TSTRING) luaL_error(L, "mirza.open: '%s' must be a string", k);
  const char *s = lua_tolstring(L, -1, len);
  lua_pop(L, 1); /* still referenced by the request table */
  return s;
}

/* A line break would let a value smuggle in headers of its own. The error
 * names the header but never shows its value: it may be a credential
 * (a key read from a file keeps its trailing newline). */
static void check_header_text(lua_State *L, const char *h) {
  if (!strpbrk(h, "\r\n")) return;
  lua_pushlstring(L, h, strcspn(h, ":\r\n"));
  luaL_error(L, "mirza.open: header '%s' contains a line break", lua_tostring(L, -1));
}

/* headers = {["X-Name"] = "v", "Other: v"} -> a NULL-terminated array in a
 * userdata (GC-owned), the strings anchored in a table; both pushed. */
static const char **build_headers(lua_State *L, int idx) {
  if (lua_getfield(L, idx, "headers") == LUA_TNIL) return NULL;
  luaL_argexpected(L, lua_istable(L, -1), 1, "table for 'headers'");
  int src = lua_gettop(L), n = 0;
  lua_newtable(L); /* [headers, anchors] */
  lua_pushnil(L);
  while (lua_next(L, src)) { /* [headers, anchors, key, value] */
    if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "mirza.open: header values must be strings");
    if (lua_type(L, -2) == LUA_TSTRING) lua_pushfstring(L, "%s: %s", lua_tostring(L, -2), lua_tostring(L, -1));
    else lua_pushvalue(L, -1);
    check_header_text(L, lua_tostring(L, -1));
    lua_rawseti(L, src + 1, ++n);
    lua_pop(L, 1);
  }
  return mz_l_strarray(L, src + 1, n); /* [src, anchors, array] */
}

/* The body: a string as is, a table encoded to JSON (pushed). */
static const char *get_body(lua_State *L, int idx, size_t *len) {
  int t = lua_getfield(L, idx, "body");
  if (t == LUA_TNIL) return NULL;
  if (t == LUA_TSTRING) return lua_tolstring(L, -1, len);
  luaL_argexpected(L, t == LUA_TTABLE, 1, "string or table for 'body'");
  return mz_l_encode(L, -1, len);
}

/* An api_key, or a header whose name looks like a credential
 * (Authorization, X-Api-Key, Cookie...: mz_is_secret). */
static int sends_credentials(const mz_request *r) {
  if (r->api_key && *r->api_key) return 1;
  for (const char *const *h = r->headers; h && *h; h++)
    if (mz_is_secret(*h, strcspn(*h, ":"))) return 1;
  return 0;
}

/* Once per Lua state: a credential about to cross the network in clear. */
static void warn_plain(lua_State *L, mz_ctx *ctx, const char *url) {
  char *shown = mz_redact_url(url), msg[640];
  ctx->warned_plain = 1;
  snprintf(msg, sizeof msg,
           "a credential (api_key or an Authorization-like header) goes in clear over plain http to %.400s, "
           "which is not this machine: use an https:// URL for a remote endpoint (or a tunnel to a loopback "
           "port). Said once.",
           shown ? shown : "a remote host");
  free(shown);
  mz_l_warn(L, msg);
}

/*
 * mirza.open{url=..., body=..., headers=..., ...} -> stream
 * Network failures are not raised: they arrive as the stream's final
 * {type="error"} event. Bad arguments raise.
 */
static int l_open(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  mz_l_check_keys(L, 1, request_keys, "mirza.open");
  mz_ctx *ctx = mz_l_ctx(L);
  lstream *u = lua_newuserdatauv(L, sizeof *u, 1); /* [req, u] created closed */
  u->s = NULL;
  u->ctx = ctx;
  u->awaited = 0;
  u->first_at = 0;
  luaL_setmetatable(L, MZ_STREAM_MT);
  mz_l_pushctx(L);
  lua_setiuservalue(L, 2, 1);

  mz_request r = {0};
  r.url = field_str(L, 1, "url", NULL);
  if (!r.url) luaL_error(L, "mirza.open: 'url' is required");
  r.method = field_str(L, 1, "method", NULL);
  r.api_key = field_str(L, 1, "api_key", NULL);
  if (r.api_key && strpbrk(r.api_key, "\r\n")) /* never echo the key */
    luaL_error(L, "mirza.open: 'api_key' contains a line break");
  r.connect_timeout_ms = field_ms(L, 1, "timeout", -1);
  r.stall_timeout_ms = field_ms(L, 1, "stall_timeout", 0);
  r.deadline_ms = field_ms(L, 1, "deadline", 0);
  r.header_timeout_ms = field_ms(L, 1, "header_timeout", 0);
  r.hold_ms = field_hold_ms(L, 1);
  const char *bad = field_str(L, 1, "on_bad_frame", NULL);
  if (bad && strcmp(bad, "skip") != 0 && strcmp(bad, "error") != 0)
    luaL_error(L, "mirza.open: 'on_bad_frame' must be \"error\" or \"skip\"");
  r.skip_bad_frames = bad && strcmp(bad, "skip") == 0;
  r.record_path = field_str(L, 1, "record_file", NULL); /* anchored by the request table */
  lua_getfield(L, 1, "plain");
  r.plain = lua_toboolean(L, -1);
  lua_getfield(L, 1, "merge");
  r.merge = lua_toboolean(L, -1);
  lua_getfield(L, 1, "step");
  r.step = lua_toboolean(L, -1);
  lua_pop(L, 3);
  r.max_event_bytes = (size_t)mz_l_opt_field(L, 1, &max_event_bytes, 0);
  r.body = get_body(L, 1, &r.body_len); /* stays on the stack */
  r.headers = build_headers(L, 1);      /* stays on the stack */

  char err[128];
  if (!(u->s = mz_stream_open(ctx->client, &r, err, sizeof err))) luaL_error(L, "mirza.open: %s", err);
  if (!ctx->warned_plain && sends_credentials(&r) && mz_url_plain_remote(r.url)) warn_plain(L, ctx, r.url);
  lua_settop(L, 2);
  mz_l_stream_opened(L, u->s, 2); /* mirza.ready() hands it out */
  if (ctx->in_task) {             /* the task's stream: cancelling the task closes it */
    mz_l_push_hook(L);
    lua_pushliteral(L, "open");
    lua_pushvalue(L, 2);
    lua_call(L, 2, 0);
  }
  return 1;
}

int luaopen_mirza_stream(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"next", s_next},         {"events", s_events},     {"chunks", s_chunks}, {"close", s_close},
      {"pending", s_pending},   {"finished", s_finished}, {"closed", s_closed}, {"next_batch", s_next_batch},
      {"first_at", s_first_at}, {"step", s_step},         {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", s_gc}, {"__close", s_close}, {"__tostring", s_tostring}, {NULL, NULL}};
  mz_l_newclass(L, MZ_STREAM_MT, meta, methods);
  lua_createtable(L, 0, 4); /* mirza.defaults */
  for (size_t i = 0; i < sizeof default_clocks / sizeof *default_clocks; i++) {
    lua_pushinteger(L, default_clocks[i].s);
    lua_setfield(L, -2, default_clocks[i].name);
  }
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, l_open, 1);
  return 2;
}
