-- runner.start and the Run object, runner.query: the Lua side of the run index (RUNNER_HOME is set by ctest).
local home = runner.home()
os.execute("rm -rf '" .. home .. "'")

local function read(path)
  local file = assert(io.open(path, "rb"))
  local text = file:read("*a")
  file:close()
  return text
end

describe("runner.start", function()
  it("creates a run with an id, a name, a directory, a seed and a device", function()
    local run = runner.start({ lr = 0.5, sizes = { 1, 2 } }, { seed = 42, name = "spec-first" })
    expect_true(run.id:match("^[0-9a-z]+$") and #run.id == 8, "id format")
    expect_eq(run.name, "spec-first")
    expect_eq(run.dir, home .. "/spec-first")
    expect_eq(run.seed, 42)
    expect_eq(run.device, torch.cuda.is_available() and "cuda:0" or "cpu")  -- the default device is "auto"
    expect_eq(run.step, 0)
    expect_eq(tostring(run), "Run(spec-first, " .. run.id .. ", step 0)")
    -- every RNG is seeded from the run's seed: torch's CPU and CUDA generators, math.random, and the key of
    -- the diffusion draws (torch.initial_seed)
    expect_eq(torch.initial_seed(), 42, "torch.initial_seed")
    local drawn, lua_drawn = torch.rand(3), { math.random(), math.random(1000000) }
    local cuda_drawn = torch.cuda.is_available() and torch.rand(3, { device = "cuda" }) or nil
    torch.manual_seed(42)
    math.randomseed(42)
    expect_true(drawn:equal(torch.rand(3)), "torch stream after start")
    expect_list(lua_drawn, { math.random(), math.random(1000000) }, "math.random after start")
    if cuda_drawn then expect_true(cuda_drawn:equal(torch.rand(3, { device = "cuda" })), "CUDA stream after start") end
    print("printed during the run")
    run:finish()
    expect_true(read(run.dir .. "/log.txt"):find("printed during the run", 1, true), "print reaches log.txt")
    local rows = runner.query("SELECT status, seed, config FROM runs WHERE id = ?", run.id)
    expect_eq(#rows, 1)
    expect_eq(rows[1].status, "finished")
    expect_eq(rows[1].seed, 42)
    expect_eq(rows[1].config, '{"lr":0.5,"sizes":[1,2]}')
    -- The control: another seed gives other draws on each stream.
    local other = runner.start({}, { seed = 43 })
    expect_true(not drawn:equal(torch.rand(3)), "seed 43 gives another torch stream")
    expect_true(lua_drawn[1] ~= math.random(), "seed 43 gives another math.random stream")
    other:finish()
  end)

  it("takes the seed and device from the config when it declares them", function()
    local run = runner.start({ seed = 7, device = "cpu" })
    expect_eq(run.seed, 7)
    run:finish()
  end)

  it("refuses unknown options and a second active run", function()
    expect_error(function() runner.start({}, { nmae = "x" }) end,
      "unknown option 'nmae' to 'runner.start' (known: device, flush_interval, fork, heartbeat, name, parent, resume, seed, system_metrics)", true)
    local run = runner.start({})
    expect_error(function() runner.start({}) end,
      here(-1) .. "run '" .. run.name .. "' is still active in this process: call run:finish() before starting another")
    run:finish()
  end)

  it("links a parent run", function()
    local parent = runner.start({}, { name = "spec-parent" })
    parent:finish()
    local child = runner.start({}, { parent = "spec-parent" })
    child:finish()
    local rows = runner.query("SELECT p.name AS parent FROM runs c JOIN runs p ON p.run = c.parent WHERE c.id = ?", child.id)
    expect_eq(rows[1].parent, "spec-parent")
  end)
end)

describe("Run", function()
  it("logs numbers and tensors at the current or a given step", function()
    local run = runner.start({})
    local loss = (torch.ones(2, { requires_grad = true }) * 1.5):sum()
    for step in run:steps(4) do
      run:log { a = step, t = loss }
    end
    run:log({ late = 9 }, 100)
    run:flush()
    local rows = runner.query("SELECT m.key, m.step, m.value FROM metrics m JOIN runs r ON r.run = m.run WHERE r.id = ? "
      .. "ORDER BY m.key, m.step", run.id)
    local seen = {}
    for _, row in ipairs(rows) do seen[#seen + 1] = row.key .. "@" .. row.step .. "=" .. row.value end
    expect_eq(table.concat(seen, " "), "a@1=1 a@2=2 a@3=3 a@4=4 late@100=9 t@1=3 t@2=3 t@3=3 t@4=3")
    expect_eq(run:native_rows(), 9)
    run:finish()
    expect_error(function() run:log { a = 1 } end, "metrics cannot be logged after the run has finished", true)
  end)

  it("counts steps and tells when a step is a multiple", function()
    local run = runner.start({})
    local hits = {}
    for step in run:steps(25) do
      if run:every(10) then hits[#hits + 1] = step end
    end
    expect_list(hits, { 10, 20 })
    expect_eq(run.step, 25)
    local more = 0
    for _ in run:steps(27) do more = more + 1 end
    expect_eq(more, 2)
    expect_error(function() run:every(0) end, "run:every expects a positive integer, got 0", true)
    run:finish()
  end)

  it("with an attached trainer, run:steps leaves run.step to the trainer: a checkpoint before a step holds that step", function()
    local run = runner.start({})
    local model = nn.Linear(2, 1)
    local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.1 }, progress = false }
    run:restore { trainer = train }
    local seen = {}
    for step in run:steps(4) do
      -- Before the trainer's step: the state a stop signal's checkpoint would save is that of run.step.
      seen[#seen + 1] = string.format("%d:%d:%d", step, run.step, train.native:step_count())
      if step ~= 3 then train:step(function() return model(torch.ones(4, 2)):pow(2):mean() end) end
    end
    expect_eq(table.concat(seen, " "), "1:0:0 2:1:1 3:2:2 4:3:2", "loop step, run.step and trainer steps")
    expect_eq(run.step, 4, "a body without a trainer step still moves the loop on")
    run:finish()
  end)

  it("writes image grids as artifacts and merges summaries", function()
    local run = runner.start({})
    run.step = 12
    local path = run:images("grid", torch.zeros(4, 3, 8, 8))
    expect_eq(path, run.dir .. "/images/grid-0000012.png")
    expect_eq(read(path):sub(1, 4), "\137PNG")
    run:set_summary { fid = 3.5 }
    run:set_summary { best = "yes", fid = 2.5 }
    run:finish()
    local rows = runner.query("SELECT a.kind, a.name, a.step, a.path, r.summary FROM artifacts a JOIN runs r ON r.run = a.run "
      .. "WHERE r.id = ?", run.id)
    expect_eq(#rows, 1)
    expect_eq(rows[1].kind .. " " .. rows[1].name .. " " .. rows[1].step .. " " .. rows[1].path,
      "image grid 12 images/grid-0000012.png")
    expect_eq(rows[1].summary, '{"best":"yes","fid":2.5}')
    expect_error(function()
      local again = runner.start({})
      local ok, err = pcall(again.images, again, "../escape", torch.zeros(1, 3, 4, 4))
      again:finish()
      error(err, 0)
    end, "image name '../escape' is not allowed", true)
  end)

  it("tags the run and sets its note in the index", function()
    local run = runner.start({})
    run:tag("baseline", "cifar-10")
    run:tag("baseline", "v1.2")
    run:note("first try")
    run:note("second try")
    local tags = runner.query("SELECT t.tag FROM run_tags t JOIN runs r ON r.run = t.run WHERE r.id = ? ORDER BY t.tag",
      run.id)
    expect_list({ tags[1].tag, tags[2].tag, tags[3].tag }, { "baseline", "cifar-10", "v1.2" })
    expect_eq(#tags, 3)
    expect_eq(runner.query("SELECT note FROM runs WHERE id = ?", run.id)[1].note, "second try")
    run:note("")
    expect_eq(runner.query("SELECT note FROM runs WHERE id = ?", run.id)[1].note, nil)
    expect_error(function() run:tag("fine", "not fine") end,
      here(-1) .. "tag name 'not fine' is not allowed: use letters, digits, '_', '-' and '.'")
    expect_error(function() run:tag() end, here() .. "run:tag expects one or more tag names")
    expect_error(function() run:tag("a", 3) end, here() .. "run:tag expects tag names (strings), got a number as argument 2")
    expect_error(function() run:note() end, "string expected", true)
    expect_eq(#runner.query("SELECT tag FROM run_tags t JOIN runs r ON r.run = t.run WHERE r.id = ?", run.id), 3)
    run:finish()
  end)

  it("rejects values that cannot be metrics, naming the script line", function()
    local run = runner.start({})
    expect_error(function() run:log { loss = "high" } end,
      here(-1) .. "run:log: 'loss' must be a number or a tensor (one element: a metric; more: a histogram), got a string")
    expect_error(function() run:log { v = torch.ones(0, 3) } end,
      here(-1) .. "run:log: 'v' is an empty tensor (shape [0, 3]): nothing to log")
    expect_error(function() run:log(5) end, here() .. "run:log expects a table of name = value")
    run:finish()
  end)

  it("records a tensor of more than one element as a histogram of 64 bins, and a one-element one as a metric", function()
    local run = runner.start({})
    run:log({ w = torch.tensor({ { 1, 2 }, { 3, 4 } }), s = torch.tensor({ 5 }) }, 3)
    run:log({ w = torch.tensor({ 7, 7, 0 / 0, 1 / 0 }) }, 4)
    run:flush()
    local rows = runner.query("SELECT h.step, h.low, h.high, h.counts, h.nonfinite FROM histograms h JOIN runs r "
      .. "ON r.run = h.run WHERE r.id = ? ORDER BY h.step", run.id)
    expect_eq(#rows, 2)
    -- bin = floor((x - low) * 64 / (high - low)), the highest value in the last bin: 1, 2, 3, 4 in bins 0, 21, 42, 63
    local counts = {}
    for i = 1, 64 do counts[i] = 0 end
    counts[1], counts[22], counts[43], counts[64] = 1, 1, 1, 1
    expect_eq(rows[1].low, 1)
    expect_eq(rows[1].high, 4)
    expect_eq(rows[1].counts, "[" .. table.concat(counts, ",") .. "]")
    expect_eq(rows[1].nonfinite, 0)
    -- All finite values equal: a range of 1 around them, both in the middle bin; NaN and inf counted apart.
    expect_eq(rows[2].low, 6.5)
    expect_eq(rows[2].high, 7.5)
    for i = 1, 64 do counts[i] = i == 33 and 2 or 0 end
    expect_eq(rows[2].counts, "[" .. table.concat(counts, ",") .. "]")
    expect_eq(rows[2].nonfinite, 2)
    local metrics = runner.query("SELECT m.key, m.value FROM metrics m JOIN runs r ON r.run = m.run WHERE r.id = ?", run.id)
    expect_eq(#metrics, 1)
    expect_eq(metrics[1].key .. "=" .. metrics[1].value, "s=5")
    run:finish()
  end)
end)

describe("runner.query", function()
  it("binds parameters, leaves NULL out of rows and refuses writes", function()
    local rows, columns = runner.query("SELECT ? AS a, NULL AS b, ? AS c", 1.5, "text")
    expect_list(columns, { "a", "b", "c" })
    expect_eq(rows[1].a, 1.5)
    expect_eq(rows[1].b, nil)
    expect_eq(rows[1].c, "text")
    expect_error(function() runner.query("DELETE FROM runs") end,
      here(-1) .. "the index is read-only here: this statement would modify it (DELETE); queries can only read")
    expect_error(function() runner.query("SELEC") end, here() .. 'SQL error: near "SELEC": syntax error')
  end)
end)
