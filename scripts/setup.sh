#!/bin/sh
# setup.sh - install what is missing (Debian packages with apt; on macOS,
# Homebrew formulae and LuaRocks rocks) and build mirza.
#   scripts/setup.sh [build-dir] [extra cmake args...]
#   scripts/setup.sh --packages PKG...   (install only; scripts/check-install)
# Sourced by scripts/demo and scripts/test; safe to run again (no-op when
# everything is installed and the build is up to date). MIRZA_EXTRA_PACKAGES
# adds packages only some jobs need (scripts/fuzz: clang). Package names are
# Debian's; on macOS each is mapped to its formula or rock, or to nothing
# where macOS or its Command Line Tools have it (brew_name below).
# MIRZA_UNAME=Darwin takes the macOS path on another system (to test it with
# a stand-in `brew` on PATH).
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ $# -gt 0 ] && shift

PACKAGES="build-essential cmake pkg-config liblua5.4-dev lua5.4 libcurl4-openssl-dev libcjson-dev libcmocka-dev lua-busted procps lsof curl jq python3 valgrind openssl ${MIRZA_EXTRA_PACKAGES:-}"
PACKAGES="$PACKAGES libreadline-dev" # line editing in the interactive prompt
# Node.js and npm for the OpenAI SDK conformance test (tests/sdk): only when
# missing, so a Node.js that ships its own npm is left alone.
command -v node >/dev/null 2>&1 || PACKAGES="$PACKAGES nodejs"
command -v npm >/dev/null 2>&1 || PACKAGES="$PACKAGES npm"
# scripts/setup.sh --packages P...: install just these (check tools), no build.
[ "$BUILD" = "--packages" ] && PACKAGES="$*"

# ---- Debian and Ubuntu: apt
apt_install() {
  missing=""
  for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    echo "setup: installing$missing" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
}

# ---- macOS: Homebrew (never apt)
# brew_name DEBIAN-PACKAGE: what stands for it on macOS: a formula, "rock:NAME"
# (installed with LuaRocks for Lua 5.4), or nothing (macOS or the Command
# Line Tools have it: compiler, curl and libcurl, openssl, perl, python3,
# ps, lsof, script, man; or there is none: valgrind, libFuzzer's runtime).
brew_name() {
  case $1 in
  liblua5.4-dev | lua5.4) echo "lua@5.4" ;; # keg-only: Homebrew's `lua` is 5.5
  pkg-config) echo pkgconf ;;
  libcjson-dev) echo cjson ;;
  libcmocka-dev) echo cmocka ;;
  libreadline-dev) echo readline ;; # keg-only: found through CMAKE_PREFIX_PATH below
  nodejs | npm) echo node ;;
  lua-busted) echo rock:busted ;;
  lua-check) echo rock:luacheck ;;
  build-essential | clang | libclang-rt-* | curl | libcurl4-openssl-dev | openssl | procps | lsof | python3 | \
    valgrind | man-db | groff-base | bsdutils) ;;
  *) echo "$1" ;; # the same name (cmake, jq, luarocks, cppcheck, clang-format)
  esac
}

brew_install() {
  command -v brew >/dev/null 2>&1 || {
    echo "setup: macOS: Homebrew is needed (https://brew.sh), then run this again" >&2
    exit 1
  }
  formulae="" rocks=""
  for p in $PACKAGES; do
    n=$(brew_name "$p")
    case $n in
    "") ;;
    rock:*) rocks="$rocks ${n#rock:}" formulae="$formulae luarocks lua@5.4" ;;
    *) formulae="$formulae $n" ;;
    esac
  done
  # one `brew list` for all: each formula missing from it is installed
  have=$(brew list --formula -1 2>/dev/null || true)
  missing=""
  for f in $formulae; do
    case " $missing " in *" $f "*) continue ;; esac
    printf '%s\n' "$have" | grep -qxF "$f" || missing="$missing $f"
  done
  if [ -n "$missing" ]; then
    echo "setup: brew installing$missing" >&2
    # shellcheck disable=SC2086
    brew install --quiet $missing >/dev/null
  fi
  case " $formulae " in *" lua@5.4 "*) lua54_env ;; esac
  for r in $rocks; do
    luarocks --lua-dir="$LUA54" show "$r" >/dev/null 2>&1 && continue
    echo "setup: luarocks installing $r (Lua 5.4)" >&2
    luarocks --lua-dir="$LUA54" install "$r" >/dev/null
  done
}

# lua54_env: the keg-only lua@5.4 made visible: its lib/pkgconfig (lua.pc,
# with lua5.4.pc and lua-5.4.pc beside it) on PKG_CONFIG_PATH for CMake's
# pkg_check_modules(lua5.4), and `lua5.4` on PATH (the specs, the docs'
# examples and scripts/check-install run the stock interpreter by that name)
# by one symlink in Homebrew's bin, through the keg's opt/ link so that it
# survives upgrades (Homebrew's `lua` 5.5 installs lua5.5, not lua5.4).
lua54_env() {
  LUA54=$(brew --prefix lua@5.4)
  PKG_CONFIG_PATH="$LUA54/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export PKG_CONFIG_PATH
  if ! command -v lua5.4 >/dev/null 2>&1 && [ -x "$LUA54/bin/lua5.4" ]; then
    ln -s "$LUA54/bin/lua5.4" "$(brew --prefix)/bin/lua5.4"
    echo "setup: linked $(brew --prefix)/bin/lua5.4 to $LUA54/bin/lua5.4 (lua@5.4 is keg-only)" >&2
  fi
}

# busted_runner FILE: busted's runner as a Lua file, for ctest to run under
# build/mirza. LuaRocks' bin/busted is a shell wrapper that starts lua5.4,
# which mirza cannot run as a script (Debian's /usr/bin/busted is Lua); the
# rocks tree's paths go first, as the wrapper sets them.
busted_runner() {
  mkdir -p "$(dirname "$1")"
  {
    echo "-- written by scripts/setup.sh: busted's runner (LuaRocks' bin/busted is a shell wrapper)"
    echo "package.path = [==[$(luarocks --lua-dir="$LUA54" path --lr-path)]==] .. ';' .. package.path"
    echo "package.cpath = [==[$(luarocks --lua-dir="$LUA54" path --lr-cpath)]==] .. ';' .. package.cpath"
    echo "require('busted.runner')({ standalone = false })"
  } >"$1.tmp"
  mv "$1.tmp" "$1"
}

if [ "${MIRZA_UNAME:-$(uname -s)}" = Darwin ]; then
  brew_install
else
  apt_install
fi

[ "$BUILD" = "--packages" ] && exit 0
if [ "${MIRZA_UNAME:-$(uname -s)}" = Darwin ]; then
  # GNU readline (keg-only) before the system's libedit, which lacks what
  # the prompt calls; busted through its Lua runner.
  case $BUILD in /*) runner=$BUILD/busted-runner.lua ;; *) runner=$(pwd)/$BUILD/busted-runner.lua ;; esac
  busted_runner "$runner"
  set -- "-DCMAKE_PREFIX_PATH=$LUA54;$(brew --prefix readline)" "-DBUSTED=$runner" "$@"
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$BUILD" -j"$(scripts/ncpu)" >/dev/null
