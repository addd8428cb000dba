/*
 * l_core.c - `mirza.core`, put together: the wait binding (l_wait.c), the
 * OS helpers (l_os.c), mirza.open (l_stream.c), processes (l_proc.c),
 * JSON (l_json.c), the repetition guard and the id sets.
 */
#include "l_core.h"

#include <lauxlib.h>

#include "mirza.h"

int luaopen_mirza_core(lua_State *L) {
  static const luaL_Reg funcs[] = {{"guard", mz_l_guard}, {"idset", mz_l_idset}, {NULL, NULL}};
  mz_l_ctx(L);
  luaL_newlib(L, funcs); /* [core] */
  mz_l_wait_funcs(L);
  mz_l_os_funcs(L);
  luaopen_mirza_stream(L); /* [core, defaults, open] */
  lua_setfield(L, -3, "open");
  lua_setfield(L, -2, "defaults");
  luaopen_mirza_proc(L); /* [core]: spawn, pid_stop, pidfile_*, file_tail... */
  luaopen_mirza_json(L);
  lua_setfield(L, -2, "json");
  lua_pushliteral(L, MIRZA_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
