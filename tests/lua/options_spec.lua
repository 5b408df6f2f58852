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
    expect_true(count >= 12, "the runtime declares its options tables (" .. count .. ")")
  end)

  it("an unknown key names the known ones, sorted", function()
    expect_error(function() runner.trainer { model = nn.Linear(2, 2), optimizer = { "adamw", lr = 1 }, speed = 3 } end,
      "unknown option 'speed' to 'runner.trainer' (known: accumulate, amp, batch, clip, data_parallel, deterministic, ema, ema_model, "
      .. "model, objective, on_nonfinite, optimizer, profile, progress, scaler, schedule, steps, tf32, warmup)", true)
  end)

  it("a list entry in a table of named options says what it is", function()
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { 4 }) end,
      here(-1) .. "'loader' takes named options only, not the entry [1] = number (known: batch, ", true)
    expect_error(function() nn.Conv2d(3, 5, 3, { 1, stride = 1 }) end,
      here(-1) .. "'Conv2d' takes named options only, not the entry [1] = number (known: stride, padding, dilation, groups, "
      .. "bias, padding_mode)", true)
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { batch = 4, "shuffle" }) end,
      here(-1) .. "'loader' takes named options only, not the entry [1] = 'shuffle' (known: ", true)
  end)

  it("a required key and a wrong type are errors at the caller's line", function()
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { shuffle = false }) end,
      here(-1) .. "loader: option 'batch' is required")
    expect_error(function() runner.data.loader(runner.data.shapes { size = 8, count = 8 }, { batch = "4" }) end,
      here(-1) .. "option 'batch' must be a number, got string")
  end)
end)
