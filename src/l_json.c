/*
 * l_json.c - mirza.json: encode/decode with cJSON, plus the conversion of
 * decoded frames into Lua tables used by l_stream.c.
 *
 * Every cJSON tree or printed buffer that is alive while Lua may raise
 * (allocation errors, bad values met half-way through a table) is owned by
 * a "box" userdata marked to-be-closed, so an error frees it (STYLE 7).
 *
 * Conventions: null <-> mirza.json.null (light userdata NULL); a table is
 * an array when its keys are exactly 1..n (n > 0) or it was marked with
 * json.array(t); an empty unmarked table is an object, "{}".
 */
#include "l_json.h"

#include <lauxlib.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "l_util.h"
#include "mirza.h"

#define MAX_DEPTH 200
#define ARRAY_MT "mirza.json.array"
#define OBJECT_MT "mirza.json.object"

typedef struct box {
  cJSON *tree;
  char *text;
} box;

static int box_close(lua_State *L) {
  box *b = luaL_checkudata(L, 1, MZ_BOX_MT);
  cJSON_Delete(b->tree);
  free(b->text);
  b->tree = NULL;
  b->text = NULL;
  return 0;
}

/* Push a new empty box, registered to be closed when the calling C
 * function returns or raises. */
static box *push_box(lua_State *L) {
  box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->tree = NULL;
  b->text = NULL;
  if (luaL_newmetatable(L, MZ_BOX_MT)) {
    lua_pushcfunction(L, box_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, box_close);
    lua_setfield(L, -2, "__close");
  }
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);
  return b;
}

/* ------------------------------------------------------------ decoding */

static void push_number(lua_State *L, double d) {
  if (d >= -9007199254740992.0 && d <= 9007199254740992.0 && d == floor(d)) lua_pushinteger(L, (lua_Integer)d);
  else lua_pushnumber(L, d);
}

void mz_l_pushjson(lua_State *L, const cJSON *v, int skip_null) {
  luaL_checkstack(L, 4, "json too deep");
  if (!v || cJSON_IsNull(v)) {
    if (skip_null) lua_pushnil(L);
    else lua_pushlightuserdata(L, NULL);
  } else if (cJSON_IsBool(v)) {
    lua_pushboolean(L, cJSON_IsTrue(v));
  } else if (cJSON_IsNumber(v)) {
    push_number(L, v->valuedouble);
  } else if (cJSON_IsString(v)) {
    lua_pushlstring(L, v->valuestring, mz_json_strlen(v));
  } else if (cJSON_IsArray(v)) {
    lua_createtable(L, cJSON_GetArraySize(v), 0);
    lua_Integer i = 1;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
      mz_l_pushjson(L, it, skip_null);
      lua_rawseti(L, -2, i);
    }
  } else {
    lua_createtable(L, 0, 4);
    for (const cJSON *it = v->child; it; it = it->next) {
      if (skip_null && cJSON_IsNull(it)) continue;
      mz_l_pushjson(L, it, skip_null);
      lua_setfield(L, -2, it->string);
    }
  }
}

/* json.decode(s) -> value | nil, message, "json" */
static int json_decode(lua_State *L) {
  size_t len, off = 0;
  const char *s = luaL_checklstring(L, 1, &len);
  box *b = push_box(L);
  b->tree = mz_json_parse_all(s, len, &off); /* "\u0000" kept, text after the value refused */
  if (!b->tree) {
    char near[24];
    snprintf(near, sizeof near, "%.20s", s + off);
    return mz_l_failf(L, "json", "invalid JSON at byte %d near '%s'", (int)off + 1, near);
  }
  mz_l_pushjson(L, b->tree, 0);
  return 1;
}

/* ------------------------------------------------------------ encoding */

static int add_value(lua_State *L, int idx, cJSON *parent, const char *key, int depth);

/* 0: object, 1: array (keys exactly 1..n, or marked by json.array). */
static int is_array(lua_State *L, int idx) {
  if (luaL_getmetafield(L, idx, "__name") != LUA_TNIL) {
    const char *name = lua_tostring(L, -1);
    int marked = !name ? -1 : strcmp(name, ARRAY_MT) == 0 ? 1 : strcmp(name, OBJECT_MT) == 0 ? 0 : -1;
    lua_pop(L, 1);
    if (marked >= 0) return marked;
  }
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx), count = 0;
  if (n == 0) return 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) { /* [key, value] */
    lua_pop(L, 1);
    lua_Integer k = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
    if (k < 1 || k > n) {
      lua_pop(L, 1);
      return 0;
    }
    count++;
  }
  return count == n;
}

static int by_key(const void *a, const void *b) {
  return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

/* An object's members in key order, so that the same table encodes to the
 * same bytes in every process (Lua's traversal order depends on its hash
 * seed): a request body, a tool's result, a recorded body match byte for
 * byte, and a daemon's prefix cache sees the same prompt. Without memory
 * for the index the order stays as built (still valid JSON). */
static void sort_members(cJSON *obj) {
  size_t n = 0, i;
  for (cJSON *c = obj->child; c; c = c->next) n++;
  if (n < 2) return;
  cJSON **v = malloc(n * sizeof *v);
  if (!v) return;
  i = 0;
  for (cJSON *c = obj->child; c; c = c->next) v[i++] = c;
  qsort(v, n, sizeof *v, by_key);
  for (i = 0; i < n; i++) {
    v[i]->prev = i ? v[i - 1] : v[n - 1]; /* cJSON: the head's prev is the tail */
    v[i]->next = i + 1 < n ? v[i + 1] : NULL;
  }
  obj->child = v[0];
  free(v);
}

static void add_table(lua_State *L, int idx, cJSON *node, int depth) {
  if (cJSON_IsArray(node)) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, idx, i);
      add_value(L, lua_gettop(L), node, NULL, depth + 1);
      lua_pop(L, 1);
    }
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) { /* [key, value] */
    int top = lua_gettop(L);
    const char *k = NULL;
    if (lua_type(L, top - 1) == LUA_TSTRING) { /* number keys: a copy, lua_next needs the original */
      size_t klen;
      k = lua_tolstring(L, top - 1, &klen);
      if (memchr(k, '\0', klen)) luaL_error(L, "json: cannot encode a table key containing NUL");
    } else if (lua_isinteger(L, top - 1)) k = lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, top - 1));
    else luaL_error(L, "json: cannot encode a table key of type %s", luaL_typename(L, top - 1));
    add_value(L, top, node, k, depth + 1);
    lua_settop(L, top - 1); /* [key] */
  }
  sort_members(node);
}

/* cJSON prints a double with 15 significant digits whenever those read
 * back within an epsilon of it, so 0.1 + 0.2 came out as 0.3 and 2^53 as
 * 9.00719925474099e+15. Numbers are printed here instead, exactly:
 * integers in full, floats with the fewest digits (15 to 17) that read
 * back as the same double, with a '.' whatever the locale says. */
static cJSON *new_number(lua_State *L, int idx) {
  char buf[48], *dp;
  char point = localeconv()->decimal_point[0];
  if (lua_isinteger(L, idx)) {
    snprintf(buf, sizeof buf, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, idx));
    return cJSON_CreateRaw(buf);
  }
  double d = lua_tonumber(L, idx);
  if (!isfinite(d)) luaL_error(L, "json: cannot encode %s", isnan(d) ? "NaN" : "infinity");
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(buf, sizeof buf, "%.*g", digits, d);
    if (strtod(buf, NULL) == d) break;
  }
  if (point != '.' && (dp = strchr(buf, point))) *dp = '.';
  return cJSON_CreateRaw(buf);
}

/* cJSON holds strings NUL-terminated, so a string with a NUL inside would
 * be cut there silently; such a string is written out here, escaped the
 * way cJSON escapes (quote, backslash, control characters). */
static cJSON *new_string(lua_State *L, int idx) {
  size_t len;
  const char *s = lua_tolstring(L, idx, &len);
  char esc[8];
  if (!memchr(s, '\0', len)) return cJSON_CreateString(s);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '"');
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') luaL_addchar(&b, '\\'), luaL_addchar(&b, (char)c);
    else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c), luaL_addstring(&b, esc);
    else luaL_addchar(&b, (char)c);
  }
  luaL_addchar(&b, '"');
  luaL_pushresult(&b); /* [text] */
  cJSON *node = cJSON_CreateRaw(lua_tostring(L, -1));
  lua_pop(L, 1);
  return node;
}

static cJSON *new_node(lua_State *L, int idx, int depth) {
  switch (lua_type(L, idx)) {
  case LUA_TNIL: return cJSON_CreateNull();
  case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
  case LUA_TSTRING: return new_string(L, idx);
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == NULL) return cJSON_CreateNull();
    break;
  case LUA_TNUMBER: return new_number(L, idx);
  case LUA_TTABLE:
    if (depth > MAX_DEPTH) luaL_error(L, "json: nesting deeper than %d (a cycle?)", MAX_DEPTH);
    return is_array(L, idx) ? cJSON_CreateArray() : cJSON_CreateObject();
  default: break;
  }
  luaL_error(L, "json: cannot encode a value of type %s", luaL_typename(L, idx));
  return NULL;
}

/* Create the node for the value at idx, attach it to parent at once (so
 * the box owns it before anything can raise), then fill tables. */
static int add_value(lua_State *L, int idx, cJSON *parent, const char *key, int depth) {
  luaL_checkstack(L, 6, "json: nesting too deep");
  cJSON *node = new_node(L, idx, depth);
  if (!node) return luaL_error(L, "not enough memory");
  if (key ? !cJSON_AddItemToObject(parent, key, node) : !cJSON_AddItemToArray(parent, node)) {
    cJSON_Delete(node);
    return luaL_error(L, "not enough memory");
  }
  if (lua_type(L, idx) == LUA_TTABLE) add_table(L, idx, node, depth);
  return 0;
}

const char *mz_l_encode(lua_State *L, int idx, size_t *len) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L); /* [slot] receives the text */
  int slot = lua_gettop(L);
  box *b = push_box(L); /* [slot, box] */
  if (!(b->tree = cJSON_CreateArray())) luaL_error(L, "not enough memory");
  add_value(L, idx, b->tree, NULL, 0);
  if (!(b->text = cJSON_PrintUnformatted(b->tree->child))) luaL_error(L, "not enough memory");
  lua_pushstring(L, b->text); /* [slot, box, text] */
  lua_copy(L, -1, slot);
  /* Close the box with lua_closeslot, not by lua_settop: Lua 5.4.4's
   * lua_settop keeps a stale top when the __close call reallocates the
   * stack (small coroutine stacks: a json body encoded inside a task). */
  lua_closeslot(L, slot + 1);
  lua_settop(L, slot);
  return lua_tolstring(L, -1, len);
}

static int json_encode(lua_State *L) {
  luaL_checkany(L, 1);
  mz_l_encode(L, 1, NULL);
  return 1;
}

static int mark(lua_State *L, const char *mt) {
  if (lua_isnoneornil(L, 1)) lua_newtable(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  luaL_setmetatable(L, mt);
  return 1;
}

static int json_array(lua_State *L) { return mark(L, ARRAY_MT); }
static int json_object(lua_State *L) { return mark(L, OBJECT_MT); }

int luaopen_mirza_json(lua_State *L) {
  static const luaL_Reg funcs[] = {{"encode", json_encode}, {"decode", json_decode},      {"array", json_array},
                                   {"object", json_object}, {"stream", mz_l_json_stream}, {NULL, NULL}};
  luaL_newmetatable(L, ARRAY_MT);
  luaL_newmetatable(L, OBJECT_MT);
  lua_pop(L, 2);
  luaL_newlib(L, funcs);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  return 1;
}
