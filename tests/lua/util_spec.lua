-- mirza.util: the shared table helpers (merge into, shallow copy) that engine, turn,
-- batch, record, init and tools use.
local util = require "mirza.util"

describe("mirza.util", function()
  it("merge sets every pair of from into into, and returns into; nil from is nothing", function()
    local into = { a = 1, b = 2 }
    assert.equal(into, util.merge(into, { b = 3, c = 4 }))
    assert.same({ a = 1, b = 3, c = 4 }, into)
    assert.same({ a = 1, b = 3, c = 4 }, util.merge(into, nil))
  end)

  it("copy is shallow and new; nil gives an empty table", function()
    local inner = {}
    local t = { x = inner, 1, 2 }
    local c = util.copy(t)
    assert.are_not.equal(t, c)
    assert.same(t, c)
    assert.equal(inner, c.x)
    c.y = true
    assert.is_nil(t.y)
    assert.same({}, util.copy(nil))
  end)
end)
