/* module.c - a Lua C module, as mirza.so is one. */
#include <lauxlib.h>
#include <lua.h>

int luaopen_smoke(lua_State *L);

int luaopen_smoke(lua_State *L) {
  lua_pushstring(L, luaL_checkstring(L, 1));
  return 1;
}
