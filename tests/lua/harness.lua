-- Runs one Lua spec file inside runner and prints "N passed, N failed".
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

function expect_eq(actual, expected, what)
  if actual ~= expected then
    fail(string.format("%sexpected %s, got %s", what and (what .. ": ") or "", tostring(expected), tostring(actual)), 2)
  end
end

function expect_true(value, what)
  if not value then fail((what or "expectation") .. " is false", 2) end
end

function expect_near(actual, expected, tolerance, what)
  if math.abs(actual - expected) > tolerance then
    fail(string.format("%sexpected %.10g +- %g, got %.10g", what and (what .. ": ") or "", expected, tolerance, actual), 2)
  end
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

-- |actual - expected| <= atol + rtol * |expected| elementwise, as torch.allclose.
function expect_close(actual, expected, atol, rtol, what)
  expect_list(actual.shape, expected.shape, (what or "tensor") .. " shape")
  local a, e = actual:double():cpu(), expected:double():cpu()
  local excess = ((a - e):abs() - (e:abs() * (rtol or 0) + atol)):max():item()
  if excess > 0 then
    local worst = (a - e):abs():max():item()
    fail(string.format("%s differs: max |diff| = %.3g (atol %g, rtol %g)", what or "tensor", worst, atol, rtol or 0), 2)
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

local chunk, load_error = loadfile(cfg.spec)
if not chunk then error(load_error, 0) end
chunk()

for _, t in ipairs(tests) do
  local ok, err = xpcall(t.body, debug.traceback)
  if runner.run then runner.run:finish(ok and "finished" or "failed") end  -- a failed test leaves no active run
  if ok then
    passed = passed + 1
    print("ok - " .. t.name)
  else
    failures = failures + 1
    print("FAIL - " .. t.name .. "\n  " .. tostring(err):gsub("\n", "\n  "))
  end
end
print(string.format("%d passed, %d failed", passed, failures))
if failures > 0 then os.exit(1) end
