-- mirza.core.mkdir_p: `mkdir -p` without a shell (mz_mkdir_mode,
-- src/pidfile.c), and the two library users that ran `mkdir -p` through a
-- shell before it: mirza.record's directory and `mirza chat`'s
-- conversations. A name with spaces, quotes or shell syntax is a name.
local core = require "mirza.core"
local conversation = require "mirza.conversation"
local record = require "mirza.record"
local H = require "tests.helper"

-- A path that does not exist yet, removed (with what is under it) after the test.
local function tmpdir()
  local dir = H.tmpname(".d")
  finally(function() os.execute("chmod -R u+rwx " .. H.q(dir) .. " 2>/dev/null; rm -rf " .. H.q(dir)) end)
  return dir
end

local function kind(path) return select(3, core.stat(path)) end

-- The permission bits of path in octal, as "700".
local mode_of = H.file_mode

local write = H.write_file

local entries = H.listing

local ODD = [[it's a "dir" $(touch pwned); `touch pwned` \ -rf * ]]

describe("mirza.core.mkdir_p", function()
  after_each(function() collectgarbage("collect") end)

  it("creates every missing directory of a nested path", function()
    local root = tmpdir()
    assert.is_true(core.mkdir_p(root .. "/a/b/c"))
    assert.equal("directory", kind(root .. "/a/b/c"))
  end)

  it("is fine with a directory already there (and a trailing or doubled slash)", function()
    local root = tmpdir()
    assert.is_true(core.mkdir_p(root .. "/a"))
    write(root .. "/a/keep", "x")
    assert.is_true(core.mkdir_p(root .. "/a"))
    assert.is_true(core.mkdir_p(root .. "/a/"))
    assert.is_true(core.mkdir_p(root .. "//a//b/"))
    assert.equal("directory", kind(root .. "/a/b"))
    assert.equal("file", kind(root .. "/a/keep")) -- nothing there was touched
  end)

  it("fails with a message when a regular file is on the way or in the place", function()
    local root = tmpdir()
    assert(core.mkdir_p(root))
    write(root .. "/f", "x")
    local ok, msg, code = core.mkdir_p(root .. "/f/sub/deeper")
    assert.is_nil(ok)
    assert.equal("cannot create " .. root .. "/f/sub/deeper: Not a directory", msg)
    assert.equal("io", code)
    ok, msg, code = core.mkdir_p(root .. "/f")
    assert.is_nil(ok)
    assert.equal("cannot create " .. root .. "/f: Not a directory", msg)
    assert.equal("io", code)
    ok, msg = core.mkdir_p("")
    assert.is_nil(ok)
    assert.equal("cannot create : No such file or directory", msg)
  end)

  it("fails with the reason where it may not write", function()
    local root = tmpdir()
    assert(core.mkdir_p(root .. "/ro", tonumber("500", 8)))
    if os.execute("test -w " .. H.q(root .. "/ro")) then return end -- root ignores permissions
    local ok, msg, code = core.mkdir_p(root .. "/ro/sub")
    assert.is_nil(ok)
    assert.equal("cannot create " .. root .. "/ro/sub: Permission denied", msg)
    assert.equal("io", code)
  end)

  it("takes spaces, quotes and shell syntax in a name as they are", function()
    local root = tmpdir()
    local odd = root .. "/" .. ODD
    assert.is_true(core.mkdir_p(odd .. "/inner"))
    assert.equal("directory", kind(odd .. "/inner"))
    assert.same({ ODD }, entries(root)) -- one directory of that name, no file made by a shell
    assert.is_nil(core.stat("pwned"))
  end)

  it("gives each new directory the mode less the umask, a parent also u+wx", function()
    local root = tmpdir()
    assert.is_true(core.mkdir_p(root .. "/p/q", tonumber("700", 8)))
    assert.equal("700", mode_of(root))
    assert.equal("700", mode_of(root .. "/p/q"))
    assert.is_true(core.mkdir_p(root .. "/r/s", tonumber("500", 8)))
    assert.equal("700", mode_of(root .. "/r")) -- or s could not have been made in it
    assert.equal("500", mode_of(root .. "/r/s"))
    assert.is_true(core.mkdir_p(root .. "/t/", tonumber("500", 8))) -- a final / is the directory's own
    assert.equal("500", mode_of(root .. "/t"))
  end)

  it("raises on a path with a NUL byte or a mode out of range", function()
    assert.has_error(function() core.mkdir_p("/tmp/a\0b") end, "bad argument #1 to 'mkdir_p' (path holds a NUL byte)")
    assert.has_error(function() core.mkdir_p("/tmp/x", -1) end)
    assert.has_error(function() core.mkdir_p("/tmp/x", 4096) end)
    assert.has_error(function() core.mkdir_p("/tmp/x", "rwx") end)
    assert.has_error(function() core.mkdir_p() end)
  end)
end)

describe("the directories the library makes", function()
  after_each(function() collectgarbage("collect") end)

  it("mirza.record: a recording directory named with spaces and quotes", function()
    local dir = tmpdir() .. "/" .. ODD .. "/recordings"
    local req, id = record.prepare({ url = "http://127.0.0.1:1/v1/chat/completions", body = "{}" }, dir)
    assert.equal("000001", id)
    assert.equal("file", kind(dir .. "/000001.request"))
    assert.equal(dir .. "/000001.response", req.record_file)
  end)

  it("mirza chat's conversations: made 0700 (parents too), whatever the name", function()
    local state = tmpdir() .. "/" .. ODD
    local dir, msg = conversation.dir(function(name) return name == "XDG_STATE_HOME" and state or nil end)
    assert.equal(state .. "/mirza/conversations", dir, msg)
    assert.equal("700", mode_of(dir))
    assert.equal("700", mode_of(state .. "/mirza"))
    assert.equal(dir, conversation.dir(function(name) return name == "XDG_STATE_HOME" and state or nil end))
  end)

  it("mirza chat's conversations: a file in the way is named in the message", function()
    local root = tmpdir()
    assert(core.mkdir_p(root))
    write(root .. "/state", "x")
    local env = function(name) return name == "XDG_STATE_HOME" and root .. "/state" or nil end
    local dir, msg, code = conversation.dir(env)
    assert.is_nil(dir)
    assert.equal("cannot create " .. root .. "/state/mirza/conversations: Not a directory", msg)
    assert.equal("io", code)
  end)
end)
