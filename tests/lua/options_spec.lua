-- Spec: every options table the runtime declares has a ---@class in stdlib/meta with exactly its keys.
local function stub_classes()
  local classes = {}
  local pipe = io.popen("ls " .. test.source("stdlib/meta") .. "/*.lua")
  for path in pipe:lines() do
    local current
    for line in io.lines(path) do
      local class = line:match("^%-%-%-@class%s+([%w_%.]+)")
      if class then
        current = {}
        classes[class] = current
      elseif current and line:match("^%-%-%-@field") then
        local key = line:match("^%-%-%-@field%s+([%w_]+)")
        current[#current + 1] = key
      elseif not line:match("^%-%-%-") then
        current = nil
      end
    end
  end
  pipe:close()
  return classes
end

local function sorted(list)
  local copy = {}
  for i, v in ipairs(list) do copy[i] = v end
  table.sort(copy)
  return table.concat(copy, ", ")
end

describe("declared options tables", function()
  it("each has a ---@meta class documenting exactly its keys", function()
    local classes = stub_classes()
    local declared = runner.option_tables()
    local count = 0
    for class, keys in pairs(declared) do
      count = count + 1
      expect_true(classes[class] ~= nil, "stdlib/meta has no ---@class " .. class)
      expect_eq(sorted(classes[class]), sorted(keys), "---@class " .. class)
    end
    expect_true(count >= 45, "the runtime declares its options tables (" .. count .. ")")
  end)

  it("each ---@field line fits in 120 columns, a longer description continuing on `---   ` lines", function()
    local pipe = io.popen("ls " .. test.source("stdlib/meta") .. "/*.lua")
    local fields = 0
    for path in pipe:lines() do
      local number = 0
      for line in io.lines(path) do
        number = number + 1
        if line:match("^%-%-%-@field") then
          fields = fields + 1
          expect_true(#line <= 120, path:match("stdlib/meta/.*") .. ":" .. number .. " is " .. #line .. " characters")
        end
      end
    end
    pipe:close()
    expect_true(fields > 300, "the stubs document their fields (" .. fields .. ")")
  end)

  it("an unknown key names the known ones, sorted", function()
    expect_error(function() runner.trainer { model = nn.Linear(2, 2), optimizer = { "adamw", lr = 1 }, speed = 3 } end,
      "unknown option 'speed' to 'runner.trainer' (known: accumulate, amp, batch, cast_weights_once, clip, data_parallel, deterministic, ema, ema_model, "
      .. "graph, model, objective, on_nonfinite, optimizer, profile, progress, scaler, schedule, shard, shard_gather, steps, tf32, warmup)", true)
  end)

  it("a list entry in a table of named options says what it is", function()
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { 4 }) end,
      here(-1) .. "'loader' takes named options only, not the entry [1] = number (known: batch, ", true)
    expect_error(function() nn.Conv2d(3, 5, 3, { 1, stride = 1 }) end,
      here(-1) .. "'Conv2d' takes named options only, not the entry [1] = number (known: bias, dilation, groups, padding, "
      .. "padding_mode, stride)", true)
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { batch = 4, "shuffle" }) end,
      here(-1) .. "'loader' takes named options only, not the entry [1] = 'shuffle' (known: ", true)
  end)

  it("runner.sweep.int takes step and log, checked as every options table is", function()
    local space = runner.sweep.int(1, 9, { step = 2 })
    expect_eq(space.kind .. " " .. space.step .. " " .. tostring(space.log), "int 2 false")
    expect_eq(tostring(runner.sweep.int(1, 9).log) .. " " .. runner.sweep.int(1, 9).step, "false 1")
    expect_error(function() runner.sweep.int(1, 9, { setp = 2 }) end,
      here(-1) .. "unknown option 'setp' to 'runner.sweep.int' (known: log, step); did you mean 'step'?")
    expect_error(function() runner.sweep.int(1, 9, { log = "yes" }) end, here(0) .. "option 'log' must be a boolean, got string")
  end)

  it("a required key and a wrong type are errors at the caller's line", function()
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { shuffle = false }) end,
      here(-1) .. "loader: option 'batch' is required")
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { batch = "4" }) end,
      here(-1) .. "option 'batch' must be a number, got string")
  end)

  it("each loss takes only the keys it reads", function()
    local F = nn.functional
    local a, b = torch.randn(4, 3), torch.randn(4, 3)
    expect_error(function() F.mse_loss(a, b, { label_smoothing = 0.1 }) end,
      here(-1) .. "unknown option 'label_smoothing' to 'mse_loss' (known: reduction)")
    expect_error(function() F.l1_loss(a, b, { weight = torch.ones(3) }) end,
      here(-1) .. "unknown option 'weight' to 'l1_loss' (known: reduction)")
    expect_error(function() F.cross_entropy(a, torch.tensor({ 0, 1, 2, 0 }, { dtype = "int64" }), { smoothing = 0.1 }) end,
      here(-1) .. "unknown option 'smoothing' to 'cross_entropy' (known: ignore_index, label_smoothing, reduction, weight)")
    expect_error(function() torch.zeros(2, { dtyp = "float64" }) end,
      here(-1) .. "unknown option 'dtyp' to 'constructor' (known: device, dtype, requires_grad); did you mean 'dtype'?")
    expect_error(function() runner.early_stopping { patince = 3 } end,
      here(-1) .. "unknown option 'patince' to 'runner.early_stopping' (known: min_delta, mode, patience); did you mean 'patience'?")
  end)

  it("keeps the defaults", function()
    local F = nn.functional
    local logits = torch.tensor({ { 1, 2, 3 }, { 3, 2, 1 } })
    local target = torch.tensor({ 2, -100 }, { dtype = "int64" })
    -- ignore_index -100: only the first row counts; mean reduction; no smoothing
    expect_near(F.cross_entropy(logits, target):item(), math.log(math.exp(1) + math.exp(2) + math.exp(3)) - 3, 1e-6)
    expect_near(F.mse_loss(torch.tensor({ 1, 3 }), torch.zeros(2)):item(), 5, 0)  -- mean
    local conv = nn.Conv2d(1, 1, 3)  -- stride 1, padding 0, bias
    expect_list(conv(torch.zeros(1, 1, 8, 8)).shape, { 1, 1, 6, 6 })
    expect_true(conv.bias ~= nil, "Conv2d has a bias by default")
    local x = torch.tensor({ { 0, 2e-3 } })
    -- eps 1e-5: (x - mean) / sqrt(var + eps) with var 1e-6
    expect_close(nn.LayerNorm(2)(x), torch.tensor({ { -1, 1 } }) * (1e-6 / (1e-6 + 1e-5)) ^ 0.5, 1e-5, 1e-5)
    expect_close(nn.GroupNorm(1, 2)(x:reshape(1, 2, 1)), torch.tensor({ -1, 1 }):reshape(1, 2, 1) * (1e-6 / (1e-6 + 1e-5)) ^ 0.5, 1e-5, 1e-5)
    local shapes = runner.data.shapes()
    expect_eq(#shapes, 10000)
    expect_list(shapes:get(1).shape, { 3, 32, 32 })
    expect_eq(tostring(shapes), "shapes 32x32: 10000 images, 3 classes")
    local stopper = runner.early_stopping()
    expect_list({ stopper.patience, stopper.mode, stopper.min_delta }, { 10, "min", 0 })
    expect_eq(torch.zeros(2).dtype, "float32")
    expect_eq(torch.arange(3).dtype, "int64")
    expect_list(runner.make_grid(torch.zeros(3, 3, 4, 4)).shape, { 4 + 2 * 2, 3 * 4 + 4 * 2, 3 })  -- one row, padding 2
  end)
end)
