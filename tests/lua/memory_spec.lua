-- Spec: tensors allocated in a loop are collected: Lua-held tensor memory, and the memory of a training loop's
-- autograd graphs, stay bounded.
describe("tensor memory", function()
  it("stays bounded in a loop that allocates 4 GB of tensors in total", function()
    collectgarbage("collect")
    local baseline = torch.held_bytes()
    local probe = torch.empty(1024, 1024)
    expect_eq(torch.held_bytes() - baseline, 4 * 2 ^ 20 + 512, "a 4 MiB tensor is counted with its 512-byte overhead")
    probe = nil
    collectgarbage("collect")
    expect_eq(torch.held_bytes() - baseline, 0, "and released")
    local peak = 0
    for _ = 1, 1000 do
      local t = torch.empty(1024, 1024)  -- 4 MiB each
      t = t + 1
      peak = math.max(peak, torch.held_bytes() - baseline)
    end
    -- Collections start once 64 MiB were allocated since the last one: the count climbs that far first.
    expect_true(peak >= 64 * 2 ^ 20 and peak < 300 * 2 ^ 20, string.format("peak held %.0f MiB in [64, 300) MiB", peak / 2 ^ 20))
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
    -- Lua's own collector frees these early (each userdata is a Lua allocation too): about 2 MiB at most here.
    expect_true(peak >= 2 ^ 20 and peak < 200 * 2 ^ 20, string.format("peak held %.1f MiB in [1, 200) MiB", peak / 2 ^ 20))
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
    -- Each step's graph holds about 70 MiB of activations: two uncollected graphs would pass the limit.
    local growth = resident_mib() - before
    expect_true(growth < 100, string.format("resident memory grew %.0f MiB over 40 steps (limit 100)", growth))
    -- The control: the same measure sees four graphs kept alive.
    local kept = {}
    for i = 1, 4 do kept[i] = nn.functional.mse_loss(model(x, t), x) end
    local kept_growth = resident_mib() - before - growth
    expect_true(kept_growth > 100, string.format("four graphs kept alive add %.0f MiB (more than 100)", kept_growth))
  end)
end)
