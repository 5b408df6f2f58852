-- Runs one Lua spec file inside runner and prints "N passed, N failed, N skipped".
--   runner tests/lua/harness.lua spec=tests/lua/tensor_spec.lua [device=cuda]
local cfg = config { spec = "", device = os.getenv("RUNNER_TEST_DEVICE") or "cpu" }
if cfg.spec == "" then runner.usage_error("give the spec file: spec=tests/lua/NAME_spec.lua") end

local source_dir = debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/harness%.lua$") or "."
local tests, failures, passed = {}, 0, 0
local prefix = {}

test = {
  device = cfg.device,
  tmp = os.getenv("RUNNER_TEST_TMP") or "/tmp/runner-test",
  python = os.getenv("RUNNER_PYTHON"),
  golden = function(name) return source_dir .. "/tests/golden/" .. name end,
  source = function(path) return source_dir .. "/" .. path end,
}
os.execute("mkdir -p '" .. test.tmp .. "'")

function describe(name, body)
  prefix[#prefix + 1] = name
  body()
  prefix[#prefix] = nil
end

function it(name, body)
  tests[#tests + 1] = { name = table.concat(prefix, " ") .. " " .. name, body = body }
end

local function fail(message, level)
  error(message, (level or 1) + 1)
end

-- Equal by ==; NaN equals NaN here, so that a NaN can be expected.
function expect_eq(actual, expected, what)
  if actual ~= expected and not (actual ~= actual and expected ~= expected) then
    fail(string.format("%sexpected %s, got %s", what and (what .. ": ") or "", tostring(expected), tostring(actual)), 2)
  end
end

function expect_true(value, what)
  if not value then fail((what or "expectation") .. " is false", 2) end
end

local function finite(x)
  return x == x and x ~= math.huge and x ~= -math.huge
end

-- |actual - expected| <= tolerance. NaN and inf fail, unless the expected value is the same non-finite value.
function expect_near(actual, expected, tolerance, what)
  local label = what and (what .. ": ") or ""
  if type(actual) ~= "number" or type(expected) ~= "number" then
    fail(string.format("%sexpected numbers, got %s and %s", label, type(actual), type(expected)), 2)
  end
  local ok
  if finite(expected) then
    ok = finite(actual) and math.abs(actual - expected) <= tolerance
  else
    ok = (actual ~= actual and expected ~= expected) or actual == expected
  end
  if not ok then fail(string.format("%sexpected %.10g +- %g, got %.10g", label, expected, tolerance, actual), 2) end
end

local function joined(list)
  local parts = {}
  for i, v in ipairs(list) do parts[i] = tostring(v) end
  return table.concat(parts, ",")
end

function expect_list(actual, expected, what)
  local a, e = joined(actual), joined(expected)
  if a ~= e then fail(string.format("%sexpected {%s}, got {%s}", what and (what .. ": ") or "", e, a), 2) end
end

-- Elementwise |actual - expected| <= atol + rtol * |expected|, as torch.allclose (equal_nan = false): a NaN or inf
-- in `actual` fails unless `expected` holds the same non-finite value at that place.
function expect_close(actual, expected, atol, rtol, what)
  what = what or "tensor"
  expect_list(actual.shape, expected.shape, what .. " shape")
  local a, e = actual:double():cpu(), expected:double():cpu()
  local within = (a - e):abs():le(e:abs() * (rtol or 0) + atol):logical_and(e:isfinite())
  local same_nonfinite = a:eq(e):logical_or(a:isnan():logical_and(e:isnan())):logical_and(e:isfinite():logical_not())
  local bad = within:logical_or(same_nonfinite):logical_not():sum():item()
  if bad > 0 then
    local nonfinite = a:isfinite():logical_not():logical_and(same_nonfinite:logical_not()):sum():item()
    local worst = (a - e):abs():max():item()
    fail(string.format("%s differs at %d of %d elements (%d of them NaN or inf): max |diff| = %.3g (atol %g, rtol %g)",
      what, bad, a:numel(), nonfinite, worst, atol, rtol or 0), 2)
  end
end

-- max |actual - expected| <= tolerance * scale, where scale defaults to max |expected|: a relative bar for tensors
-- whose small elements carry only rounding. NaN and inf anywhere fail.
function expect_scaled_close(actual, expected, tolerance, what, scale)
  what = what or "tensor"
  expect_list(actual.shape, expected.shape, what .. " shape")
  local a, e = actual:double():cpu(), expected:double():cpu()
  if a:isfinite():logical_not():sum():item() > 0 then fail(what .. " has NaN or inf elements", 2) end
  scale = scale or e:abs():max():item()
  local worst = (a - e):abs():max():item()
  if not (worst <= tolerance * math.max(scale, 1e-12)) then
    fail(string.format("%s: max |diff| %.3g exceeds %g x max |reference| %.3g", what, worst, tolerance, scale), 2)
  end
end

-- The error raised by fn must equal `expected` exactly (or contain it when plain_find is true).
function expect_error(fn, expected, plain_find)
  local ok, err = pcall(fn)
  if ok then fail("expected an error: " .. expected, 2) end
  err = tostring(err)
  if plain_find then
    if not err:find(expected, 1, true) then fail(string.format("error %q does not contain %q", err, expected), 2) end
  elseif err ~= expected then
    fail(string.format("expected error\n    %s\n  got\n    %s", expected, err), 2)
  end
end

-- Where a line of this spec is, for exact error texts: "tests/lua/x_spec.lua:LINE: ".
function here(offset)
  local info = debug.getinfo(2, "Sl")
  return info.short_src .. ":" .. (info.currentline + (offset or 0)) .. ": "
end

-- skip(reason) ends the calling test as skipped: it prints "SKIP - <test>: <reason>" and is neither a pass nor a
-- failure. For tests that cannot run here (no CUDA device, no Python).
local skip_marker = {}
function skip(reason)
  error(setmetatable({ reason = reason }, skip_marker), 2)
end

local chunk, load_error = loadfile(cfg.spec)
if not chunk then error(load_error, 0) end
chunk()

local skipped = 0
for _, t in ipairs(tests) do
  local ok, err = xpcall(t.body, function(e)
    if getmetatable(e) == skip_marker then return e end
    return debug.traceback(e, 2)
  end)
  if runner.run then runner.run:finish(ok and "finished" or "failed") end  -- a failed test leaves no active run
  if ok then
    passed = passed + 1
    print("ok - " .. t.name)
  elseif getmetatable(err) == skip_marker then
    skipped = skipped + 1
    print("SKIP - " .. t.name .. ": " .. err.reason)
  else
    failures = failures + 1
    print("FAIL - " .. t.name .. "\n  " .. tostring(err):gsub("\n", "\n  "))
  end
end
print(string.format("%d passed, %d failed, %d skipped", passed, failures, skipped))
if failures > 0 then os.exit(1) end
