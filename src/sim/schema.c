/*
 * schema.c - answers in shape: JSON text generated from the request's
 * response_format (json_schema with a schema, or json_object), so a
 * client's structured-output path can be tested without a model.
 *
 * The value is built from the schema, deterministically from the seed
 * (--seed and the last user message): const, else an enum member, else by
 * type (the first non-null one of a list; none: guessed from properties,
 * items, length or numeric bounds). Objects get every declared property in
 * order, then required members that are not declared; an object schema
 * with no properties gets one "answer" string member (json_object).
 * Arrays have 3 items unless minItems/maxItems say otherwise (beyond a
 * nesting depth of 4, minItems: a recursive schema ends). Strings are a
 * few words padded or cut to minLength/maxLength, or fit a format (date,
 * date-time, time, email, uri, uuid, ipv4); integers and numbers lie
 * within minimum/maximum (exclusive too) and honour an integer multipleOf;
 * a number has a fractional part when the bounds allow, so oneOf
 * [number, integer] holds. $ref is resolved against the whole schema (a
 * JSON pointer: #/$defs/x, #/definitions/x, ...), allOf branches are
 * merged into one schema (properties and required joined; other keywords:
 * the first one wins), anyOf/oneOf take the first branch. Not modelled:
 * pattern, patternProperties, propertyNames, min/maxProperties,
 * uniqueItems, contains, prefixItems, not, if/then/else, dependent*.
 *
 * The text is written as Python's json.dumps does (", " and ": "), so the
 * token loop's split at blanks streams it in small deltas.
 *
 * schema-break: the first object that has a required member (in
 * generation order) is written without it; when none has, the whole value
 * is of a wrong type.
 */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define SCHEMA_DEEP 4 /* beyond this depth, arrays get minItems items */
#define SCHEMA_MAX_DEPTH 32
#define SCHEMA_MAX_ITEMS 10000    /* a minItems beyond it is not met */
#define SCHEMA_MAX_LENGTH 1000000 /* nor a minLength beyond it */

typedef struct sgen {
  sbuf out;
  uint64_t rng;
  const cJSON *root;
  bool brk; /* schema-break still to do */
} sgen;

static uint64_t rnd(sgen *g) {
  uint64_t z = (g->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* A JSON pointer ("#/$defs/item") into the root; NULL when it names nothing. */
static const cJSON *pointer(const cJSON *root, const char *ref) {
  if (ref[0] != '#') return NULL;
  const cJSON *at = root;
  for (const char *p = ref + 1; *p == '/' && at;) {
    char key[256];
    size_t n = 0;
    for (p++; *p && *p != '/' && n + 1 < sizeof key; p++) {
      if (*p == '~' && (p[1] == '0' || p[1] == '1')) key[n++] = *++p == '0' ? '~' : '/';
      else key[n++] = *p;
    }
    key[n] = '\0';
    at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(key)) : get(at, key);
  }
  return at;
}

static const cJSON *resolve(const sgen *g, const cJSON *s) {
  for (int i = 0; i < 16 && s; i++) {
    const cJSON *ref = get(s, "$ref");
    if (!cJSON_IsString(ref)) return s;
    s = pointer(g->root, ref->valuestring);
  }
  return s;
}

static bool has_string(const cJSON *list, const char *s) {
  const cJSON *x;
  cJSON_ArrayForEach(x, list) if (cJSON_IsString(x) && strcmp(x->valuestring, s) == 0) return true;
  return false;
}

/* Add b's keywords to m: properties and required joined, the rest only
 * when m has none of its own. */
static void merge_into(cJSON *m, const cJSON *b) {
  const cJSON *k;
  cJSON_ArrayForEach(k, b) {
    cJSON *mine = cJSON_GetObjectItemCaseSensitive(m, k->string);
    if (strcmp(k->string, "properties") == 0 && cJSON_IsObject(k)) {
      if (!cJSON_IsObject(mine)) {
        cJSON_DeleteItemFromObjectCaseSensitive(m, "properties");
        mine = cJSON_AddObjectToObject(m, "properties");
      }
      const cJSON *p;
      cJSON_ArrayForEach(p, k) if (!get(mine, p->string)) cJSON_AddItemToObject(mine, p->string, cJSON_Duplicate(p, 1));
    } else if (strcmp(k->string, "required") == 0 && cJSON_IsArray(k)) {
      if (!cJSON_IsArray(mine)) {
        cJSON_DeleteItemFromObjectCaseSensitive(m, "required");
        mine = cJSON_AddArrayToObject(m, "required");
      }
      const cJSON *r;
      cJSON_ArrayForEach(r, k) if (cJSON_IsString(r) && !has_string(mine, r->valuestring))
          cJSON_AddItemToArray(mine, cJSON_CreateString(r->valuestring));
    } else if (!mine) {
      cJSON_AddItemToObject(m, k->string, cJSON_Duplicate(k, 1));
    }
  }
}

/* The schema s as one plain schema (an owned copy): $ref resolved, allOf
 * merged, the first branch of anyOf/oneOf merged in. NULL: false (nothing
 * validates). */
static cJSON *flatten(const sgen *g, const cJSON *s, int depth) {
  s = resolve(g, s);
  if (cJSON_IsFalse(s)) return NULL;
  if (!cJSON_IsObject(s) || depth > SCHEMA_MAX_DEPTH) return cJSON_CreateObject();
  cJSON *m = cJSON_Duplicate(s, 1);
  static const char *const drop[] = {"$ref", "allOf", "anyOf", "oneOf"};
  for (size_t i = 0; i < sizeof drop / sizeof *drop; i++) cJSON_DeleteItemFromObjectCaseSensitive(m, drop[i]);
  const cJSON *b;
  cJSON_ArrayForEach(b, get(s, "allOf")) {
    cJSON *f = flatten(g, b, depth + 1);
    if (f) merge_into(m, f);
    cJSON_Delete(f);
  }
  const cJSON *any = get(s, "anyOf"), *one = get(s, "oneOf");
  const cJSON *first = cJSON_GetArraySize(any) ? any->child : cJSON_GetArraySize(one) ? one->child : NULL;
  if (first) {
    cJSON *f = flatten(g, first, depth + 1);
    if (f) merge_into(m, f);
    cJSON_Delete(f);
  }
  return m;
}

/* The type to generate: the first non-null one named, else guessed. */
static const char *type_of(const cJSON *m) {
  const cJSON *t = get(m, "type");
  if (cJSON_IsString(t)) return t->valuestring;
  const char *null = NULL;
  const cJSON *x;
  cJSON_ArrayForEach(x, t) {
    if (!cJSON_IsString(x)) continue;
    if (strcmp(x->valuestring, "null") != 0) return x->valuestring;
    null = "null";
  }
  if (null) return null;
  if (get(m, "properties") || get(m, "required") || get(m, "additionalProperties")) return "object";
  if (get(m, "items") || get(m, "minItems") || get(m, "maxItems")) return "array";
  if (get(m, "minimum") || get(m, "maximum") || get(m, "exclusiveMinimum") || get(m, "exclusiveMaximum"))
    return "number";
  return "string";
}

static void add_json(sgen *g, const cJSON *v) {
  char *t = cJSON_PrintUnformatted(v);
  sbuf_adds(&g->out, t);
  free(t);
}

static void add_str(sgen *g, const char *s, size_t n) {
  sbuf_add(&g->out, "\"", 1);
  sbuf_json_esc(&g->out, s, n);
  sbuf_add(&g->out, "\"", 1);
}

static long num_or(const cJSON *m, const char *k, long dflt) {
  const cJSON *v = get(m, k);
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0)) return dflt;
  return v->valuedouble < 1e15 ? (long)v->valuedouble : (long)1e15;
}

static const char *const WORDS[] = {"quick", "model",  "answer", "local", "stream", "token", "clear", "simple",
                                    "cache", "server", "field",  "value", "record", "small", "river", "garden"};
#define NWORDS (sizeof WORDS / sizeof *WORDS)

static bool fits(const char *s, long lo, long hi) {
  long n = (long)strlen(s);
  return n >= lo && (hi < 0 || n <= hi);
}

static void gen_string(sgen *g, const cJSON *m) {
  long lo = num_or(m, "minLength", 0), hi = num_or(m, "maxLength", -1);
  if (lo > SCHEMA_MAX_LENGTH) lo = SCHEMA_MAX_LENGTH;
  const cJSON *fmt = get(m, "format");
  if (cJSON_IsString(fmt)) {
    char buf[128];
    const char *f = fmt->valuestring;
    unsigned d = (unsigned)(rnd(g) % 28) + 1, h = (unsigned)(rnd(g) % 24), k = (unsigned)(rnd(g) % 1000);
    buf[0] = '\0';
    if (strcmp(f, "date") == 0) snprintf(buf, sizeof buf, "2025-03-%02u", d);
    else if (strcmp(f, "date-time") == 0) snprintf(buf, sizeof buf, "2025-03-%02uT%02u:30:00Z", d, h);
    else if (strcmp(f, "time") == 0) snprintf(buf, sizeof buf, "%02u:30:00Z", h);
    else if (strcmp(f, "email") == 0) snprintf(buf, sizeof buf, "%s%u@example.com", WORDS[k % NWORDS], k);
    else if (strcmp(f, "uri") == 0 || strcmp(f, "url") == 0)
      snprintf(buf, sizeof buf, "https://example.com/%s/%u", WORDS[k % NWORDS], k);
    else if (strcmp(f, "uuid") == 0) snprintf(buf, sizeof buf, "%08x-0000-4000-8000-%012u", (unsigned)rnd(g), k);
    else if (strcmp(f, "ipv4") == 0) snprintf(buf, sizeof buf, "192.0.2.%u", k % 255);
    if (buf[0] && fits(buf, lo, hi)) {
      add_str(g, buf, strlen(buf));
      return;
    }
  }
  sbuf w = {0};
  int words = 1 + (int)(rnd(g) % 3);
  for (int i = 0; i < words || (long)w.len < lo; i++) {
    if (i) sbuf_add(&w, " ", 1);
    sbuf_adds(&w, WORDS[rnd(g) % NWORDS]);
  }
  size_t n = w.len;
  if (hi >= 0 && (long)n > hi) n = (size_t)hi;
  while (n > 0 && w.p[n - 1] == ' ' && (long)n > lo) n--; /* no trailing blank when it can be helped */
  add_str(g, w.p ? w.p : "", n);
  sbuf_free(&w);
}

/* Bounds of a number: [lo, hi], with exclusive flags. */
static void bounds(const cJSON *m, double *lo, double *hi, bool *xlo, bool *xhi) {
  const cJSON *mn = get(m, "minimum"), *mx = get(m, "maximum");
  const cJSON *emn = get(m, "exclusiveMinimum"), *emx = get(m, "exclusiveMaximum");
  bool has_lo = false, has_hi = false;
  *xlo = *xhi = false;
  if (cJSON_IsNumber(mn)) *lo = mn->valuedouble, has_lo = true;
  if (cJSON_IsNumber(emn) && (!has_lo || emn->valuedouble >= *lo)) *lo = emn->valuedouble, has_lo = *xlo = true;
  if (cJSON_IsNumber(mx)) *hi = mx->valuedouble, has_hi = true;
  if (cJSON_IsNumber(emx) && (!has_hi || emx->valuedouble <= *hi)) *hi = emx->valuedouble, has_hi = *xhi = true;
  if (!has_lo) *lo = has_hi ? *hi - 100 : 0;
  if (!has_hi) *hi = *lo + 100;
}

static void gen_integer(sgen *g, const cJSON *m) {
  double lo, hi;
  bool xlo, xhi;
  bounds(m, &lo, &hi, &xlo, &xhi);
  double a = xlo ? floor(lo) + 1 : ceil(lo), b = xhi ? ceil(hi) - 1 : floor(hi);
  const cJSON *mo = get(m, "multipleOf");
  double step =
      cJSON_IsNumber(mo) && mo->valuedouble >= 1 && mo->valuedouble == floor(mo->valuedouble) ? mo->valuedouble : 1;
  a = ceil(a / step) * step;
  double count = b >= a ? floor((b - a) / step) + 1 : 1;
  if (!(count >= 1)) count = 1; /* NaN too (infinite bounds) */
  if (count > 1e15) count = 1e15;
  uint64_t n = (uint64_t)count; /* 1 to 1e15 */
  double v = a + step * (double)(rnd(g) % (n ? n : 1));
  sbuf_printf(&g->out, "%.0f", isfinite(v) ? v : 0.0);
}

static void gen_number(sgen *g, const cJSON *m) {
  double lo, hi;
  bool xlo, xhi;
  bounds(m, &lo, &hi, &xlo, &xhi);
  double v = lo + (hi - lo) * (double)(rnd(g) % 1000) / 1000.0;
  v = round(v * 100) / 100;
  bool ok_lo = xlo ? v > lo : v >= lo, ok_hi = xhi ? v < hi : v <= hi;
  if (!ok_lo || !ok_hi) v = (lo + hi) / 2;
  if (v == floor(v)) { /* a fractional part when it fits */
    double f = v + 0.5;
    if (xhi ? f < hi : f <= hi) v = f;
    else if (xlo ? v - 0.5 > lo : v - 0.5 >= lo) v -= 0.5;
  }
  sbuf_printf(&g->out, "%.15g", isfinite(v) ? v : 0.0); /* infinite bounds: cJSON reads 1e999 so */
}

static void value(sgen *g, const cJSON *schema, int depth);

static void member(sgen *g, bool *first, const char *name, const cJSON *schema, int depth) {
  sbuf_adds(&g->out, *first ? "" : ", ");
  *first = false;
  add_str(g, name, strlen(name));
  sbuf_adds(&g->out, ": ");
  value(g, schema, depth + 1);
}

static void gen_object(sgen *g, const cJSON *m, int depth) {
  const cJSON *props = get(m, "properties"), *req = get(m, "required"), *addl = get(m, "additionalProperties");
  const char *drop = NULL;
  if (g->brk) {
    const cJSON *r;
    cJSON_ArrayForEach(r, req) if (cJSON_IsString(r)) {
      drop = r->valuestring;
      g->brk = false;
      break;
    }
  }
  bool first = true;
  const cJSON *p, *r;
  sbuf_add(&g->out, "{", 1);
  cJSON_ArrayForEach(p, props) if (!drop || strcmp(p->string, drop) != 0) member(g, &first, p->string, p, depth);
  cJSON_ArrayForEach(r, req) {
    if (!cJSON_IsString(r) || get(props, r->valuestring) || (drop && strcmp(r->valuestring, drop) == 0)) continue;
    member(g, &first, r->valuestring, cJSON_IsObject(addl) ? addl : NULL, depth);
  }
  if (first && !props && !cJSON_IsFalse(addl) && !drop)
    member(g, &first, "answer", cJSON_IsObject(addl) ? addl : NULL, depth);
  sbuf_add(&g->out, "}", 1);
}

static void gen_array(sgen *g, const cJSON *m, int depth) {
  long lo = num_or(m, "minItems", 0), hi = num_or(m, "maxItems", -1);
  long n = depth >= SCHEMA_DEEP ? lo : 3;
  if (n < lo) n = lo;
  if (hi >= 0 && n > hi) n = hi;
  if (n > SCHEMA_MAX_ITEMS) n = SCHEMA_MAX_ITEMS;
  const cJSON *items = get(m, "items");
  sbuf_add(&g->out, "[", 1);
  for (long i = 0; i < n; i++) {
    if (i) sbuf_adds(&g->out, ", ");
    value(g, cJSON_IsArray(items) ? cJSON_GetArrayItem(items, (int)i) : items, depth + 1);
  }
  sbuf_add(&g->out, "]", 1);
}

/* Write a value valid against schema (NULL or true: any; a string then). */
static void value(sgen *g, const cJSON *schema, int depth) {
  cJSON *m = schema ? flatten(g, schema, 0) : cJSON_CreateObject();
  if (!m) {
    sbuf_adds(&g->out, "null"); /* false: nothing is valid */
    return;
  }
  const cJSON *cst = get(m, "const"), *en = get(m, "enum");
  const char *t = type_of(m);
  if (cst) add_json(g, cst);
  else if (cJSON_GetArraySize(en) > 0)
    add_json(g, cJSON_GetArrayItem(en, (int)(rnd(g) % (uint64_t)cJSON_GetArraySize(en))));
  else if (depth > SCHEMA_MAX_DEPTH) sbuf_adds(&g->out, "null");
  else if (strcmp(t, "object") == 0) gen_object(g, m, depth);
  else if (strcmp(t, "array") == 0) gen_array(g, m, depth);
  else if (strcmp(t, "integer") == 0) gen_integer(g, m);
  else if (strcmp(t, "number") == 0) gen_number(g, m);
  else if (strcmp(t, "boolean") == 0) sbuf_adds(&g->out, rnd(g) & 1 ? "true" : "false");
  else if (strcmp(t, "null") == 0) sbuf_adds(&g->out, "null");
  else gen_string(g, m);
  cJSON_Delete(m);
}

char *schema_answer(const cJSON *rf, uint64_t seed, bool brk, size_t *len) {
  const cJSON *type = get(rf, "type");
  if (!cJSON_IsString(type)) return NULL;
  const cJSON *schema;
  if (strcmp(type->valuestring, "json_schema") == 0) schema = get(get(rf, "json_schema"), "schema");
  else if (strcmp(type->valuestring, "json_object") == 0) schema = get(rf, "schema"); /* llama-server's extension */
  else return NULL;
  cJSON *object = cJSON_IsObject(schema) ? NULL : cJSON_Parse("{\"type\":\"object\"}");
  sgen g = {.rng = seed ^ 0x5c4e3aull, .root = object ? object : schema, .brk = brk};
  value(&g, g.root, 0);
  if (g.brk) { /* no required member to drop: a value of the wrong type */
    cJSON *m = flatten(&g, g.root, 0);
    bool str = m && strcmp(type_of(m), "string") == 0;
    cJSON_Delete(m);
    g.out.len = 0;
    sbuf_adds(&g.out, str ? "12345" : "\"schema-break\"");
  }
  cJSON_Delete(object);
  *len = g.out.len;
  return g.out.p ? g.out.p : sim_strndup("", 0);
}

size_t schema_cut(const char *text, size_t n) {
  size_t cut = n / 2;
  while (cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80) cut--;
  return cut;
}
