/* main.c - an executable over the static library, Lua and -lreadline
 * (libedit on a Mac). */
#include "smoke.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <readline/history.h>
#include <readline/readline.h>

int main(void) {
  lua_State *L = luaL_newstate();
  char *line;
  luaL_openlibs(L);
  line = readline("> ");
  if (line != NULL) add_history(line);
  free(line);
  lua_close(L);
  return smoke_core() ? 0 : 1;
}
