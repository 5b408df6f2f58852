-- Spec of the harness's own checks: each numeric helper fails on NaN and inf unless the expected value is the
-- same non-finite value, and reports what differed.
local nan, inf = 0 / 0, 1 / 0

-- The error text of a helper call that must fail; a helper that passes fails this spec.
local function failure_of(helper, ...)
  local ok, err = pcall(helper, ...)
  if ok then error("the check passed but must fail", 2) end
  return tostring(err)
end

local function passes(helper, ...)
  local ok, err = pcall(helper, ...)
  if not ok then error("the check failed but must pass: " .. tostring(err), 2) end
end

describe("expect_near", function()
  it("fails on NaN and inf against a finite value, however wide the tolerance", function()
    expect_true(failure_of(expect_near, nan, 1, 1e300, "loss"):find("loss: expected 1 +- 1e+300, got nan", 1, true))
    failure_of(expect_near, inf, 1, 1e300)
    failure_of(expect_near, -inf, 1, math.huge)
    failure_of(expect_near, 1, 1, nan)
  end)

  it("passes the same non-finite value and fails another one", function()
    passes(expect_near, nan, nan, 0)
    passes(expect_near, inf, inf, 0)
    passes(expect_near, -inf, -inf, 0)
    failure_of(expect_near, inf, -inf, 0)
    failure_of(expect_near, inf, nan, 0)
    failure_of(expect_near, 1, inf, math.huge)
    failure_of(expect_near, 1, nan, math.huge)
  end)

  it("compares finite values with the tolerance, inclusive", function()
    passes(expect_near, 1.5, 1, 0.5)
    failure_of(expect_near, 1.5000001, 1, 0.5)
    expect_true(failure_of(expect_near, torch.ones(1), 1, 0):find("expected numbers, got userdata and number", 1, true))
  end)
end)

describe("expect_close", function()
  local reference = torch.tensor({ 1, 2, 3 })

  it("fails on a NaN or inf element, however wide the tolerance", function()
    local message = failure_of(expect_close, torch.tensor({ 1, nan, 3 }), reference, 1e300, 1e300, "weights")
    expect_true(message:find("weights differs at 1 of 3 elements (1 of them NaN or inf)", 1, true), message)
    failure_of(expect_close, torch.tensor({ 1, 2, inf }), reference, 1e300, 1e300)
    failure_of(expect_close, torch.tensor({ -inf, 2, 3 }), reference, 0, 1e300)
    failure_of(expect_close, torch.full({ 3 }, nan), reference, 0, 0)
    failure_of(expect_close, reference, reference, nan, 0)
  end)

  it("passes the same non-finite values at the same places and fails others", function()
    passes(expect_close, torch.tensor({ nan, inf, -inf, 1 }), torch.tensor({ nan, inf, -inf, 1 }), 0, 0)
    passes(expect_close, torch.tensor({ nan, inf, 1 }), torch.tensor({ nan, inf, 1 }), 1, 1)
    failure_of(expect_close, torch.tensor({ 1, 1 }), torch.tensor({ nan, 1 }), 1e300, 1e300)
    failure_of(expect_close, torch.tensor({ 1, 1 }), torch.tensor({ inf, 1 }), 1e300, 1e300)
    failure_of(expect_close, torch.tensor({ -inf, 1 }), torch.tensor({ inf, 1 }), 1e300, 1e300)
    failure_of(expect_close, torch.tensor({ inf, nan }), torch.tensor({ nan, inf }), 0, 0)
  end)

  it("compares as torch.allclose: atol + rtol * |expected|", function()
    passes(expect_close, torch.tensor({ 1.5, 2, 3 }), reference, 0.5, 0)
    passes(expect_close, torch.tensor({ 1, 2, 3.75 }), reference, 0, 0.25)
    failure_of(expect_close, torch.tensor({ 1, 2, 3.76 }), reference, 0, 0.25)
    failure_of(expect_close, torch.tensor({ 1, 2 }), torch.tensor({ 1, 2, 3 }), 1, 1)
  end)
end)

describe("expect_scaled_close", function()
  local reference = torch.tensor({ 10, -20, 0.001 })

  it("fails on NaN or inf, and on a difference beyond tolerance x max |expected|", function()
    local message = failure_of(expect_scaled_close, torch.tensor({ 10, nan, 0 }), reference, 1, "grad")
    expect_true(message:find("grad has NaN or inf elements", 1, true), message)
    failure_of(expect_scaled_close, torch.tensor({ inf, -20, 0 }), reference, 1e300)
    failure_of(expect_scaled_close, reference, torch.tensor({ 10, nan, 0 }), 1e300)
    failure_of(expect_scaled_close, reference, reference, nan)
    passes(expect_scaled_close, torch.tensor({ 10.2, -20, 0.2 }), reference, 0.01)
    message = failure_of(expect_scaled_close, torch.tensor({ 10.3, -20, 0 }), reference, 0.01, "out")
    expect_true(message:find("out: max |diff| 0.3 exceeds 0.01 x max |reference| 20", 1, true), message)
    passes(expect_scaled_close, torch.tensor({ 10.3, -20, 0 }), reference, 0.01, "out", 40)
  end)
end)

describe("expect_eq", function()
  it("fails on NaN against a number and passes NaN against NaN", function()
    failure_of(expect_eq, nan, 0)
    failure_of(expect_eq, 0, nan)
    failure_of(expect_eq, inf, -inf)
    passes(expect_eq, nan, nan)
    passes(expect_eq, inf, inf)
  end)
end)

describe("skip", function()
  it("ends a test with the reason, neither passed nor failed", function()
    local ok, err = pcall(skip, "no CUDA device")
    expect_true(not ok and type(err) == "table" and err.reason == "no CUDA device", "skip raises the skip marker")
  end)
end)
