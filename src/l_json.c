/*
 * l_json.c - mirza.json: encode (written directly) and decode (cJSON), plus the conversion of
 * decoded frames into Lua tables used by l_stream.c.
 *
 * Every cJSON tree or printed buffer that is alive while Lua may raise
 * (allocation errors, bad values met half-way through a table) is owned by
 * a "box" userdata marked to-be-closed, so an error frees it (STYLE 7).
 *
 * Conventions: null <-> mirza.json.null (light userdata NULL); a table is
 * an array when its keys are exactly 1..n (n > 0) or it was marked with
 * json.array(t); an empty unmarked table is an object, "{}". A decoded
 * array is marked (mz_l_pushjson), so "[]" decodes to a table that
 * encodes as "[]" again: JSON keeps its shape through Lua.
 */
#include "l_json.h"

#include <lauxlib.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "jsonstream.h"
#include "l_util.h"
#include "mirza.h"

#define MAX_DEPTH 200
#define ARRAY_MT "mirza.json.array"
#define OBJECT_MT "mirza.json.object"

typedef struct key key;

typedef struct box {
  cJSON *tree;
  char *text;      /* decode: unused; encode: the JSON being written */
  size_t len, cap; /* encode: bytes written, allocated */
  key *keys;       /* encode: the members of the objects being written, a stack */
  size_t nkeys, keys_cap;
} box;

static int box_close(lua_State *L) {
  box *b = luaL_checkudata(L, 1, MZ_BOX_MT);
  cJSON_Delete(b->tree);
  free(b->text);
  free(b->keys);
  b->tree = NULL;
  b->text = NULL;
  b->keys = NULL;
  return 0;
}

/* Push a new empty box, registered to be closed when the calling C
 * function returns or raises. */
static box *push_box(lua_State *L) {
  box *b = lua_newuserdatauv(L, sizeof *b, 0);
  *b = (box){0};
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

int mz_l_json_members(const cJSON *obj, int skip_null) {
  int n = 0;
  for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) n += !(skip_null && cJSON_IsNull(it));
  return n;
}

/* Mark the table on top as an array: json.array's metatable (made here
 * when mirza.json was not opened yet: a stream's events come without it).
 * A registry look-up and a pointer store, no allocation after the first. */
static void mark_array(lua_State *L) {
  if (luaL_getmetatable(L, ARRAY_MT) == LUA_TNIL) {
    lua_pop(L, 1);
    luaL_newmetatable(L, ARRAY_MT);
  }
  lua_setmetatable(L, -2);
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
    mark_array(L);
    lua_Integer i = 1;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
      mz_l_pushjson(L, it, skip_null);
      lua_rawseti(L, -2, i);
    }
  } else { /* sized for its members: no rehash as they go in */
    lua_createtable(L, 0, mz_l_json_members(v, skip_null));
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

/* Whether a JSON pointer of one level ("/name", '~' and '/' in the name
 * written "~0" and "~1") names the member `name` as cJSON names it: a key
 * ends at its first NUL ("\u0000x" is ""), so both find the same member. */
static int pointer_names(const char *path, size_t plen, const char *name) {
  if (plen == 0 || path[0] != '/') return 0;
  size_t i = 1;
  for (; *name; name++) {
    const char *want = *name == '~' ? "~0" : *name == '/' ? "~1" : NULL;
    size_t n = want ? 2 : 1;
    if (plen - i < n || memcmp(path + i, want ? want : name, n) != 0) return 0;
    i += n;
  }
  return i == plen || path[i] == '\0';
}

/* The first member `name` of the JSON object s[0..len) as written: where
 * its text starts in s (and *tlen), or NULL when the strict parser
 * (jsonstream.h) cannot say: no such member, or a spelling only cJSON
 * takes ("01"). cJSON keeps a number as a double only; this gives back
 * its digits. No Lua call while the parser is alive: nothing to leak. */
static const char *member_text(const char *s, size_t len, const char *name, size_t *tlen) {
  mz_jsonstream p;
  if (mz_js_init(&p, 1, len ? len : 1)) return NULL;
  mz_js_start(&p, '{', 1);
  const char *found = NULL;
  size_t off = 0, used = 0;
  mz_js_value v;
  while (!found && off <= len && mz_js_feed(&p, s + off, len - off, &used, &v) == MZ_JS_VALUE) {
    off += used;
    if (pointer_names(v.path, v.path_len, name)) {
      found = s + v.offset; /* v.text may be the parser's copy, freed below */
      *tlen = v.len;
    }
  }
  mz_js_free(&p);
  return found;
}

/* json.peek(s, key) -> kind, value[, text] | nil, message, "json": the
 * kind of the JSON text's top value ("object", "array", "string",
 * "number", "boolean", "null") and, for an object, its member `key` when
 * that is a string or a number (a number as a Lua number), without
 * building any Lua table: what a batch run reads of each of a million
 * input lines before it sends one (the custom_id). A number of 2^53 or
 * more (either sign) is a float, which may not be the number written
 * (1234567890123456789 reads as ...768): its text as written comes third,
 * when the strict parser can give it. Same parser and errors as decode. */
static int json_peek(lua_State *L) {
  size_t len, off = 0;
  const char *s = luaL_checklstring(L, 1, &len);
  const char *name = luaL_checkstring(L, 2);
  box *b = push_box(L);
  b->tree = mz_json_parse_all(s, len, &off);
  if (!b->tree) {
    char near[24];
    snprintf(near, sizeof near, "%.20s", s + off);
    return mz_l_failf(L, "json", "invalid JSON at byte %d near '%s'", (int)off + 1, near);
  }
  const cJSON *t = b->tree;
  lua_pushstring(L, cJSON_IsObject(t)   ? "object"
                    : cJSON_IsArray(t)  ? "array"
                    : cJSON_IsString(t) ? "string"
                    : cJSON_IsNumber(t) ? "number"
                    : cJSON_IsBool(t)   ? "boolean"
                                        : "null");
  const cJSON *v = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, name) : NULL;
  if (cJSON_IsString(v)) lua_pushlstring(L, v->valuestring, mz_json_strlen(v)); /* "\u0000" kept */
  else if (cJSON_IsNumber(v) && fabs(v->valuedouble) >= 9007199254740992.0) {
    size_t n = 0;
    const char *text = member_text(s, len, name, &n);
    lua_pushnumber(L, v->valuedouble);
    if (!text) return 2;
    lua_pushlstring(L, text, n);
    return 3;
  } else if (cJSON_IsNumber(v)) push_number(L, v->valuedouble);
  else lua_pushnil(L);
  return 2;
}

/* ------------------------------------------------------------ encoding */

/* Lua values are written as JSON text straight into the box's buffer (no
 * cJSON tree: a request body or a record costs a fifth of building,
 * printing and freeing one), byte for byte what cJSON printed: no white
 * space; a string's quote, backslash and control characters escaped as
 * cJSON escapes them (\b \f \n \r \t, else \u00XX; NUL as \u0000, other
 * bytes as they are); an object's members in key order. */

struct key {
  const char *s; /* the table's own key string; NULL: an integer key */
  size_t len;
  lua_Integer i;
  char num[24]; /* the integer key, written out */
};

/* The key's text (num moves with the array: never kept across a realloc). */
static const char *key_text(const key *k) { return k->s ? k->s : k->num; }

static void grow(lua_State *L, box *b, size_t n) {
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len < n) cap *= 2;
  char *t = realloc(b->text, cap);
  if (!t) luaL_error(L, "not enough memory");
  b->text = t;
  b->cap = cap;
}

static inline void put(lua_State *L, box *b, const char *s, size_t n) {
  if (b->cap - b->len < n) grow(L, b, n);
  memcpy(b->text + b->len, s, n);
  b->len += n;
}

/* The escape of each byte that needs one (cJSON's); 0: as it is. */
/* clang-format off */
static const char ESCAPE[256] = {
    'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'b', 't', 'n', 'u', 'f', 'r', 'u', 'u', /* 0x00 */
    'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', /* 0x10 */
    ['"'] = '"', ['\\'] = '\\'};
/* clang-format on */

static void put_string(lua_State *L, box *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  if (b->cap - b->len < n + 2) grow(L, b, n + 2);
  b->text[b->len++] = '"';
  size_t run = 0; /* start of the bytes not yet written */
  for (size_t i = 0; i < n; i++) {
    char e = ESCAPE[(unsigned char)s[i]];
    if (!e) continue;
    put(L, b, s + run, i - run);
    run = i + 1;
    unsigned char c = (unsigned char)s[i];
    char esc[6] = {'\\', e, '0', '0', hex[c >> 4], hex[c & 15]};
    put(L, b, esc, e == 'u' ? 6 : 2);
  }
  put(L, b, s + run, n - run);
  put(L, b, "\"", 1);
}

/* cJSON prints a double with 15 significant digits whenever those read
 * back within an epsilon of it, so 0.1 + 0.2 came out as 0.3 and 2^53 as
 * 9.00719925474099e+15. Numbers are printed here instead, exactly:
 * integers in full, floats with the fewest digits (15 to 17) that read
 * back as the same double, with a '.' whatever the locale says. */
/* An integer's digits, written backwards from end (snprintf's "%lld" costs
 * ten times as much); returns where they start. */
static char *int_text(lua_Integer i, char *end) {
  lua_Unsigned u = i < 0 ? 0u - (lua_Unsigned)i : (lua_Unsigned)i;
  char *p = end;
  do *--p = (char)('0' + u % 10);
  while ((u /= 10) != 0);
  if (i < 0) *--p = '-';
  return p;
}

/* The common float (a duration, a rate: a decimal of up to 15 significant
 * digits, at most 3 after the point, from 0.001 to 1e15) written by
 * integer arithmetic. It is the decimal D = m / 10^k the double d is
 * nearest to (the division is rounded as strtod rounds D), so "%.15g"
 * would print D too, and the loop below stop at 15 digits: the same bytes,
 * without a snprintf and a strtod. 0 when d is not such a number. */
static int put_short_decimal(lua_State *L, box *b, double d) {
  static const double p10[] = {1, 10, 100, 1000};
  double a = fabs(d);
  if (!(a >= 0.001 && a < 1e15)) return 0; /* zero (-0.0 too), tiny, huge */
  for (int k = 0; k < 4; k++) {
    double m = a * p10[k];
    if (m >= 1e15) return 0;
    if (m != floor(m) || m / p10[k] != a) continue;
    char buf[24], *end = buf + sizeof buf, *p = int_text((lua_Integer)m, end);
    size_t n = (size_t)(end - p);
    char out[32], *o = out;
    if (d < 0) *o++ = '-';
    if (k == 0) {
      memcpy(o, p, n), o += n;
    } else {
      size_t whole = n > (size_t)k ? n - (size_t)k : 0;
      if (whole) memcpy(o, p, whole), o += whole;
      else *o++ = '0';
      *o++ = '.';
      for (size_t z = n; z < (size_t)k; z++) *o++ = '0'; /* 0.005: the zeros after the point */
      memcpy(o, p + whole, n - whole), o += n - whole;
      while (o[-1] == '0') o--; /* as %g: no trailing zeros, */
      if (o[-1] == '.') o--;    /* nor a point left alone */
    }
    put(L, b, out, (size_t)(o - out));
    return 1;
  }
  return 0;
}

static void put_number(lua_State *L, box *b, int idx) {
  char buf[48], *dp;
  if (lua_isinteger(L, idx)) {
    char *end = buf + sizeof buf, *p = int_text(lua_tointeger(L, idx), end);
    put(L, b, p, (size_t)(end - p));
    return;
  }
  double d = lua_tonumber(L, idx);
  if (!isfinite(d)) luaL_error(L, "json: cannot encode %s", isnan(d) ? "NaN" : "infinity");
  if (put_short_decimal(L, b, d)) return;
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(buf, sizeof buf, "%.*g", digits, d);
    if (strtod(buf, NULL) == d) break;
  }
  char point = localeconv()->decimal_point[0];
  if (point != '.' && (dp = strchr(buf, point))) *dp = '.';
  put(L, b, buf, strlen(buf));
}

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

/* Byte order, as strcmp on keys without NUL (a prefix first). */
static int by_key(const void *pa, const void *pb) {
  const key *a = pa, *b = pb;
  int c = memcmp(key_text(a), key_text(b), a->len < b->len ? a->len : b->len);
  return c ? c : (a->len > b->len) - (a->len < b->len);
}

static void put_value(lua_State *L, box *b, int idx, int depth);

/* An object's members in key order, so that the same table encodes to the
 * same bytes in every process (Lua's traversal order depends on its hash
 * seed): a request body, a tool's result, a recorded body match byte for
 * byte, and a daemon's prefix cache sees the same prompt. Its keys are
 * gathered on the box's stack of keys (a string key is the table's own,
 * alive as long as the table), sorted, then each value looked up. */
static void put_object(lua_State *L, box *b, int idx, int depth) {
  size_t base = b->nkeys;
  lua_pushnil(L);
  while (lua_next(L, idx)) { /* [key, value] */
    lua_pop(L, 1);
    if (b->nkeys == b->keys_cap) {
      size_t cap = b->keys_cap ? b->keys_cap * 2 : 16;
      key *k = realloc(b->keys, cap * sizeof *k);
      if (!k) luaL_error(L, "not enough memory");
      b->keys = k;
      b->keys_cap = cap;
    }
    key *k = &b->keys[b->nkeys];
    if (lua_type(L, -1) == LUA_TSTRING) { /* number keys: a copy, lua_next needs the original */
      k->s = lua_tolstring(L, -1, &k->len);
      if (memchr(k->s, '\0', k->len)) luaL_error(L, "json: cannot encode a table key containing NUL");
    } else if (lua_isinteger(L, -1)) {
      k->i = lua_tointeger(L, -1);
      char *end = k->num + sizeof k->num, *p = int_text(k->i, end);
      k->len = (size_t)(end - p);
      memmove(k->num, p, k->len); /* key_text reads from num[0] */
      k->s = NULL;
    } else {
      luaL_error(L, "json: cannot encode a table key of type %s", luaL_typename(L, -1));
    }
    b->nkeys++;
  }
  size_t n = b->nkeys - base;
  if (n > 1) qsort(b->keys + base, n, sizeof *b->keys, by_key);
  put(L, b, "{", 1);
  for (size_t i = 0; i < n; i++) {
    const key *k = &b->keys[base + i]; /* again each time: nested objects move the array */
    if (i) put(L, b, ",", 1);
    put_string(L, b, key_text(k), k->len);
    put(L, b, ":", 1);
    if (k->s) lua_pushlstring(L, k->s, k->len);
    else lua_pushinteger(L, k->i);
    lua_rawget(L, idx);
    put_value(L, b, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
  }
  put(L, b, "}", 1);
  b->nkeys = base;
}

static void put_value(lua_State *L, box *b, int idx, int depth) {
  switch (lua_type(L, idx)) {
  case LUA_TNIL: put(L, b, "null", 4); return;
  case LUA_TBOOLEAN:
    if (lua_toboolean(L, idx)) put(L, b, "true", 4);
    else put(L, b, "false", 5);
    return;
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    put_string(L, b, s, n);
    return;
  }
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == NULL) {
      put(L, b, "null", 4);
      return;
    }
    break;
  case LUA_TNUMBER: put_number(L, b, idx); return;
  case LUA_TTABLE:
    if (depth > MAX_DEPTH) luaL_error(L, "json: nesting deeper than %d (a cycle?)", MAX_DEPTH);
    luaL_checkstack(L, 6, "json: nesting too deep");
    if (!is_array(L, idx)) {
      put_object(L, b, idx, depth);
      return;
    }
    put(L, b, "[", 1);
    for (lua_Integer i = 1, n = (lua_Integer)lua_rawlen(L, idx); i <= n; i++) {
      if (i > 1) put(L, b, ",", 1);
      lua_rawgeti(L, idx, i);
      put_value(L, b, lua_gettop(L), depth + 1);
      lua_pop(L, 1);
    }
    put(L, b, "]", 1);
    return;
  default: break;
  }
  luaL_error(L, "json: cannot encode a value of type %s", luaL_typename(L, idx));
}

const char *mz_l_encode(lua_State *L, int idx, size_t *len) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L); /* [slot] receives the text */
  int slot = lua_gettop(L);
  box *b = push_box(L); /* [slot, box] */
  put_value(L, b, idx, 0);
  lua_pushlstring(L, b->text, b->len); /* [slot, box, text] */
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
  static const luaL_Reg funcs[] = {
      {"encode", json_encode}, {"decode", json_decode},      {"peek", json_peek}, {"array", json_array},
      {"object", json_object}, {"stream", mz_l_json_stream}, {NULL, NULL}};
  luaL_newmetatable(L, ARRAY_MT);
  luaL_newmetatable(L, OBJECT_MT);
  lua_pop(L, 2);
  luaL_newlib(L, funcs);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  return 1;
}
