-- Spec: tensors allocated in a loop are collected: Lua-held tensor memory, and the memory of a training loop's
-- autograd graphs, stay bounded.
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

  it("a training loop does not keep earlier steps' graphs alive", function()
    local function resident_mib()
      for line in io.lines("/proc/self/status") do
        local kib = line:match("^VmRSS:%s+(%d+)")
        if kib then return tonumber(kib) / 1024 end
      end
    end
    torch.manual_seed(0)
    local model = nn.UNet { image = 16, channels = 16, mults = { 1, 2 }, blocks = 1, attention = { 8 }, dropout = 0, groups = 4 }
    local opt = optim.AdamW(model, { lr = 1e-3 })
    local x = torch.randn(64, 3, 16, 16)
    local t = torch.full({ 64 }, 10, { dtype = "int64" })
    local function step()
      local loss = nn.functional.mse_loss(model(x, t), x)
      opt:zero_grad()
      loss:backward()
      opt:step()
    end
    for _ = 1, 5 do step() end
    local before = resident_mib()
    for _ = 1, 40 do step() end
    -- Each step's graph holds about 10 MiB of activations; 40 uncollected graphs would add 400 MiB.
    local growth = resident_mib() - before
    expect_true(growth < 100, string.format("resident memory grew %.0f MiB over 40 steps (limit 100)", growth))
  end)
end)
