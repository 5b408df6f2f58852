-- Spec: tensors allocated in a loop are collected: Lua-held tensor memory stays bounded.
describe("tensor memory", function()
  it("stays bounded in a loop that allocates 4 GB of tensors in total", function()
    collectgarbage("collect")
    local baseline = torch.held_bytes()
    local peak = 0
    for _ = 1, 1000 do
      local t = torch.empty(1024, 1024)  -- 4 MiB each
      t = t + 1
      peak = math.max(peak, torch.held_bytes() - baseline)
    end
    expect_true(peak < 300 * 1024 * 1024, string.format("peak held %.0f MiB below 300 MiB", peak / 2 ^ 20))
    collectgarbage("collect")
    expect_true(torch.held_bytes() - baseline < 1024 * 1024, "everything released after a collection")
  end)

  it("stays bounded for many small tensors", function()
    collectgarbage("collect")
    local baseline = torch.held_bytes()
    local peak = 0
    for i = 1, 200000 do
      local t = torch.tensor(i)
      peak = math.max(peak, torch.held_bytes() - baseline)
    end
    expect_true(peak < 200 * 1024 * 1024, string.format("peak held %.0f MiB below 200 MiB", peak / 2 ^ 20))
  end)
end)
