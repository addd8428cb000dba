-- mirza-dev-1.rockspec - `luarocks make` builds the checked-out tree with
-- CMake and installs the C module mirza.so (the whole mirza library: the C
-- core and the Lua modules compiled in; any `require "mirza.<name>"` can come
-- first), the `mirza` and `mirza-sim` executables, the jobs and the Lua
-- sources (for --lua-dir: lib/luarocks/rocks-5.4/mirza/dev-1/share/mirza/lua)
-- into a LuaRocks tree:
--   luarocks --lua-version 5.4 make --tree /tmp/t
--   LUA_CPATH='/tmp/t/lib/lua/5.4/?.so;;' lua5.4 -e 'require "mirza.engine"'
-- System libraries: libcurl and cJSON (Debian: libcurl4-openssl-dev,
-- libcjson-dev), Lua 5.4 headers (liblua5.4-dev), cmake and pkg-config.
rockspec_format = "3.0"
package = "mirza"
version = "dev-1"

source = {
  -- No published repository yet: `luarocks make` uses the tree it runs in.
  url = "git+file://.",
}

description = {
  summary = "Drive local OpenAI-compatible LLM daemons from Lua 5.4",
  detailed = [[
A small C engine (libcurl SSE streaming, cJSON frame decoding, a daemon
supervisor) with a Lua library on top: streams are read with `for` loops,
policies are reloadable Lua. Includes the `mirza` host and the `mirza-sim`
simulator daemon.]],
  labels = { "llm", "sse", "http", "streaming" },
}

dependencies = {
  "lua >= 5.4, < 5.5",
}

external_dependencies = {
  CURL = { library = "curl" }, -- the header is in a multiarch directory on Debian
  CJSON = { header = "cjson/cJSON.h" },
}

build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    CMAKE_INSTALL_BINDIR = "$(BINDIR)",
    CMAKE_INSTALL_DOCDIR = "$(DOCDIR)",
    MIRZA_INSTALL_LUA_CDIR = "$(LIBDIR)",
    -- absolute: the binary is deployed to TREE/bin, the jobs stay in the rock
    MIRZA_INSTALL_JOBSDIR = "$(PREFIX)/share/mirza/jobs",
  },
}
