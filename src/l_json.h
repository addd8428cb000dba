/*
 * l_json.h - Lua <-> JSON (cJSON), shared by the bindings.
 */
#ifndef MIRZA_L_JSON_H
#define MIRZA_L_JSON_H

#include <cJSON.h>
#include <lua.h>

/* Push v as a Lua value. null becomes mirza.json.null (a light userdata
 * NULL), or is left out of objects/arrays-as-holes when skip_null is set
 * (then a top-level null pushes nil). Numbers that are integral and in
 * range become Lua integers. An array is marked as json.array marks one
 * (metatable "mirza.json.array"), so that it encodes as an array even
 * when empty; an object is a plain table ("{}" when empty). */
void mz_l_pushjson(lua_State *L, const cJSON *v, int skip_null);
/* How many members of object obj mz_l_pushjson sets (nulls not, with
 * skip_null): a table's size hint. 0 for NULL. */
int mz_l_json_members(const cJSON *obj, int skip_null);

/* Encode the value at idx; pushes the JSON text (a Lua string) and
 * returns it. Raises on values JSON cannot hold (functions, NaN, cycles). */
const char *mz_l_encode(lua_State *L, int idx, size_t *len);

/* mirza.json.stream{depth = N}: the incremental parser (l_jsonstream.c). */
int mz_l_json_stream(lua_State *L);

int luaopen_mirza_json(lua_State *L);

#endif
