-- busted's configuration for every spec ctest runs (tests/tests.cmake passes
-- it with --config-file): MIRZA_TEST_CASES, when set, holds Lua patterns, one
-- a line, and a spec runs only the cases whose full name (the describe
-- names and the `it`'s, joined by spaces) matches one of them (busted's
-- --filter). scripts/mutate sets it from a mutant's `cases =` lines, so a
-- mutant on a slow spec runs the cases that pin its behaviour, not the file.
local filter = {}
for pattern in (os.getenv("MIRZA_TEST_CASES") or ""):gmatch("[^\n]+") do
  filter[#filter + 1] = pattern
end
return { _all = { filter = filter } }
