-- Spec: the data loader — seeded order independent of workers, resume, sharding, errors, memory, Lua datasets;
-- the procedural shapes and their options.
local data = runner.data

-- All batches of a loader over `count` steps: {data = {...}, index = {...}, label = {...}}.
local function collect(loader, count)
  local out = { data = {}, index = {}, label = {}, step = {} }
  for _ = 1, count do
    local batch = loader:next()
    out.data[#out.data + 1] = batch.data
    out.index[#out.index + 1] = batch.index
    out.label[#out.label + 1] = batch.label
    out.step[#out.step + 1] = batch.step
  end
  return out
end

local function expect_same_batches(a, b, what)
  expect_eq(#a.data, #b.data, what .. ": batch count")
  for i = 1, #a.data do
    expect_true(a.index[i]:equal(b.index[i]), string.format("%s: indices of batch %d", what, i))
    expect_true(a.data[i]:equal(b.data[i]), string.format("%s: data of batch %d", what, i))
    expect_true(a.label[i]:equal(b.label[i]), string.format("%s: labels of batch %d", what, i))
  end
end

local augment = { random_crop = 24, flip = true }

describe("order and augmentation", function()
  it("gives the same batches for a seed whatever the worker count", function()
    local ds = data.shapes { size = 32, count = 100, seed = 3 }
    local steps = 17  -- more than two epochs of 7 batches
    local reference = collect(data.loader(ds, { batch = 16, seed = 11, workers = 0, transform = augment }), steps)
    for _, workers in ipairs({ 1, 3, 8 }) do
      local loader = data.loader(ds, { batch = 16, seed = 11, workers = workers, prefetch = workers + 1, transform = augment })
      expect_same_batches(collect(loader, steps), reference, workers .. " workers")
    end
  end)

  it("draws a new permutation each epoch and a different one for another seed", function()
    local ds = data.shapes { size = 8, count = 40, seed = 0 }
    local loader = data.loader(ds, { batch = 40, seed = 1, workers = 1 })
    local first, second = loader:next().index, loader:next().index
    expect_true(not first:equal(second), "epochs 1 and 2 differ")
    expect_list(first:sort():tolist(), torch.arange(40):tolist(), "epoch 1 is a permutation")
    expect_list(second:sort():tolist(), torch.arange(40):tolist(), "epoch 2 is a permutation")
    local other = data.loader(ds, { batch = 40, seed = 2, workers = 1 }):next().index
    expect_true(not first:equal(other), "seeds 1 and 2 differ")
  end)

  it("keeps dataset order without shuffle and ends the epoch with the partial batch", function()
    local ds = data.shapes { size = 8, count = 10, seed = 0 }
    local loader = data.loader(ds, { batch = 4, shuffle = false, workers = 2 })
    expect_eq(#loader, 3)
    local sizes, indices = {}, {}
    for batch in loader:iter() do
      sizes[#sizes + 1] = batch.data:size(1)
      for _, i in ipairs(batch.index:tolist()) do indices[#indices + 1] = i end
      expect_eq(batch.epoch, 1)
    end
    expect_list(sizes, { 4, 4, 2 })
    expect_list(indices, { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 })
    local dropping = data.loader(ds, { batch = 4, shuffle = false, drop_last = true, workers = 2 })
    expect_eq(#dropping, 2)
  end)

  it("augments each sample as a function of (seed, epoch, index)", function()
    local ds = data.shapes { size = 32, count = 8, seed = 0 }
    local loader = data.loader(ds, { batch = 8, shuffle = false, workers = 2, transform = augment, seed = 5 })
    local epoch1, epoch2 = loader:next().data, loader:next().data
    expect_true(not epoch1:equal(epoch2), "a new epoch draws new crops and flips")
    local again = data.loader(ds, { batch = 4, shuffle = false, workers = 1, transform = augment, seed = 5 })
    expect_true(torch.cat({ again:next().data, again:next().data }, 1):equal(epoch1), "independent of batch size")
  end)
end)

describe("shapes", function()
  local count = 48
  local function images(options)
    options.size, options.count, options.seed = 16, count, 4
    local batch = data.loader(data.shapes(options), { batch = count, shuffle = false, workers = 1 }):next()
    return batch.data, batch.label:tolist()
  end
  -- Per row of image i, the columns the shape touches (any pixel off the background), as a string.
  local function rows(covered, i)
    local out = {}
    for _, row in ipairs(covered[i]:tolist()) do
      local columns = {}
      for x, on in ipairs(row) do if on then columns[#columns + 1] = x end end
      if #columns > 0 then out[#out + 1] = columns end
    end
    return out
  end
  local function is_upright(label, shape_rows)
    if label == 0 then return true end
    for r = 2, #shape_rows do
      local above, here_ = shape_rows[r - 1], shape_rows[r]
      if label == 1 and table.concat(above, ",") ~= table.concat(here_, ",") then return false end  -- a rectangle
      if label == 2 and (here_[1] > above[1] or here_[#here_] < above[#above]) then return false end  -- widens downwards
    end
    return true
  end

  it("draws white shapes on black with colours = false, each index keeping its class and outline", function()
    local coloured, labels = images {}
    local plain, plain_labels = images { colours = false }
    expect_list(plain_labels, labels, "labels")
    expect_true(plain:select(2, 1):equal(plain:select(2, 2)) and plain:select(2, 1):equal(plain:select(2, 3)), "grey")
    expect_eq(plain:min():item(), -1)
    expect_eq(plain:max():item(), 1)
    -- The shape covers the same pixels: off the background colour (the top-left corner's, never covered) in
    -- the coloured image exactly where the plain one is not black.
    local background = coloured:narrow(3, 1, 1):narrow(4, 1, 1)
    local off_background = coloured:ne(background):any(2)
    expect_true(off_background:equal(plain:gt(-1):any(2)), "same outlines")
  end)

  it("draws upright squares and triangles pointing up with rotate = false, at the same places", function()
    local rotated, labels = images { colours = false }
    local upright, upright_labels = images { colours = false, rotate = false }
    expect_list(upright_labels, labels, "labels")
    local covered, covered_rotated = upright:gt(-1):any(2), rotated:gt(-1):any(2)
    local tilted = 0
    for i = 1, count do
      expect_true(is_upright(labels[i], rows(covered, i)), "image " .. i .. " (label " .. labels[i] .. ") upright")
      if not is_upright(labels[i], rows(covered_rotated, i)) then tilted = tilted + 1 end
      if labels[i] == 0 then expect_true(upright[i]:equal(rotated[i]), "circle " .. i .. " unchanged") end
    end
    expect_true(tilted > count / 3, "by default most squares and triangles are tilted (" .. tilted .. ")")
  end)

  it("refuses a wrong option at the script's line", function()
    expect_error(function() data.shapes { colours = "no" } end, here(0) .. "option 'colours' must be a boolean, got string")
    expect_error(function() data.shapes { color = false } end,
      here(-1) .. "unknown option 'color' to 'data.shapes' (known: colours, count, rotate, seed, size); did you mean 'colours'?")
    expect_error(function() data.npy { pth = "x.npy" } end, here(0) .. "unknown option 'pth' to 'data.npy'", true)
  end)
end)

describe("resume", function()
  it("continues after a restored state exactly as an uninterrupted run", function()
    local ds = data.shapes { size = 16, count = 50, seed = 1 }
    local options = { batch = 8, seed = 9, workers = 2, transform = { flip = true } }
    local uninterrupted = collect(data.loader(ds, options), 12)
    local first = data.loader(ds, options)
    collect(first, 5)
    local state = first:state()
    expect_eq(state.position, 5)
    expect_eq(state.seed, 9)
    local resumed = data.loader(ds, { batch = 8, seed = 123, workers = 3, transform = { flip = true } })
    resumed:restore(state)
    local rest = collect(resumed, 7)
    for i = 1, 7 do
      expect_true(rest.data[i]:equal(uninterrupted.data[i + 5]), "batch " .. (i + 5))
      expect_eq(rest.step[i], i + 5)
    end
  end)

  it("iter{from, to} yields the batches after `from` up to `to`", function()
    local ds = data.shapes { size = 8, count = 30, seed = 1 }
    local all = collect(data.loader(ds, { batch = 7, seed = 4, workers = 1 }), 10)
    local loader = data.loader(ds, { batch = 7, seed = 4, workers = 2 })
    local steps = {}
    for batch in loader:iter { from = 6, to = 10 } do
      steps[#steps + 1] = batch.step
      expect_true(batch.index:equal(all.index[batch.step]), "step " .. batch.step)
    end
    expect_list(steps, { 7, 8, 9, 10 })
    expect_error(function() loader:iter { form = 6, to = 10 } end,
      here(-1) .. "unknown option 'form' to 'loader:iter' (known: from, to); did you mean 'from'?")
  end)

  it("refuses a state saved by a different setup", function()
    local ds = data.shapes { size = 8, count = 30, seed = 1 }
    local state = data.loader(ds, { batch = 7, workers = 0 }):state()
    local other = data.loader(ds, { batch = 5, workers = 0 })
    expect_error(function() other:restore(state) end,
      here(-1) .. "loader state was saved with batch 7 but this loader has 5")
  end)
end)

describe("sharding", function()
  local function epoch_indices(size, batch, world, drop_last)
    local seen, steps = {}, nil
    for rank = 0, world - 1 do
      local ds = data.shapes { size = 4, count = size, seed = 0 }
      local loader = data.loader(ds, { batch = batch, rank = rank, world_size = world, seed = 7, drop_last = drop_last, workers = 1 })
      if steps then expect_eq(#loader, steps, "every rank takes the same number of steps") end
      steps = #loader
      for b in loader:iter() do
        for _, i in ipairs(b.index:tolist()) do seen[i] = (seen[i] or 0) + 1 end
      end
    end
    return seen
  end

  it("covers every index exactly once per epoch across ranks", function()
    local seen = epoch_indices(29, 12, 3, false)
    for i = 0, 28 do expect_eq(seen[i], 1, "index " .. i) end
  end)

  it("with drop_last leaves out the tail and repeats nothing", function()
    local seen = epoch_indices(29, 12, 3, true)
    local count = 0
    for _, n in pairs(seen) do
      expect_eq(n, 1)
      count = count + n
    end
    expect_eq(count, 24)
  end)

  it("splits the global batch over the ranks: the same samples as one process, at any world size", function()
    local ds = data.shapes { size = 4, count = 40, seed = 0 }
    local whole = data.loader(ds, { batch = 8, seed = 3, workers = 0 })
    local ranks = {}
    for rank = 0, 3 do ranks[rank] = data.loader(ds, { batch = 8, rank = rank, world_size = 4, seed = 3, workers = 0 }) end
    for _ = 1, 3 do
      local expected = whole:next().index:tolist()
      local got = {}
      for rank = 0, 3 do
        local part = ranks[rank]:next().index:tolist()
        expect_eq(#part, 2, "each of 4 ranks takes 2 of the global batch of 8")
        for _, i in ipairs(part) do got[#got + 1] = i end
      end
      expect_list(got, expected)
    end
    -- A state saved by rank 3 of 4 continues rank 1 of 2 with the same global stream.
    local state = ranks[3]:state()
    local two = data.loader(ds, { batch = 8, rank = 1, world_size = 2, seed = 3, workers = 0 })
    two:restore(state)
    local expected = whole:next().index:tolist()
    expect_list(two:next().index:tolist(), { expected[5], expected[6], expected[7], expected[8] })
    expect_error(function() data.loader(ds, { batch = 6, rank = 0, world_size = 4 }) end,
      here(-1) .. "loader: batch 6 (the global batch of all ranks) does not split evenly over 4 ranks")
  end)

  it("rejects a rank outside the world", function()
    local ds = data.shapes { size = 4, count = 10, seed = 0 }
    expect_error(function() data.loader(ds, { batch = 2, rank = 2, world_size = 2 }) end,
      here(-1) .. "loader: rank 2 is not in 0..1 for world_size 2")
  end)
end)

describe("bad input", function()
  local folder = test.tmp .. "/data_spec_images"
  os.execute("rm -rf '" .. folder .. "' && mkdir -p '" .. folder .. "'")
  local function write(name, bytes)
    local f = assert(io.open(folder .. "/" .. name, "wb"))
    f:write(bytes)
    f:close()
  end
  -- A valid 2x2 grayscale PNG (made with PIL), and a text file pretending to be a JPEG.
  write("a.png", "\137PNG\13\10\26\10\0\0\0\13IHDR\0\0\0\2\0\0\0\2\8\0\0\0\0W\221R\248\0\0\0\14IDATx\156c\244e`b`\0\0\1\147\0Q\151O\155\143\0\0\0\0IEND\174B`\130")
  write("b.jpg", "this is not an image")
  write("c.png", "\137PNG\13\10\26\10\0\0\0\13IHDR\0\0\0\2\0\0\0\2\8\0\0\0\0W\221R\248\0\0\0\14IDATx\156c\244e`b`\0\0\1\147\0Q\151O\155\143\0\0\0\0IEND\174B`\130")

  it("raises the worker's error with the file name, and does not hang", function()
    local loader = data.loader(data.image_folder { path = folder }, { batch = 3, workers = 2, shuffle = false })
    expect_error(function() loader:next() end,
      here(-1) .. folder .. "/b.jpg: not a JPEG or PNG image (unrecognised first bytes) (on_error = \"skip\" leaves bad samples out)")
    expect_error(function() loader:next() end, "b.jpg: not a JPEG or PNG image", true)
  end)

  it("skips bad samples when asked, counting them", function()
    local loader = data.loader(data.image_folder { path = folder }, { batch = 3, workers = 2, shuffle = false, on_error = "skip" })
    local batch = loader:next()
    expect_eq(batch.data:size(1), 2)
    expect_list(batch.index:tolist(), { 0, 2 })
    loader:next()
    expect_eq(loader:stats().skipped, 2)  -- b.jpg in each of two epochs
    for _ = 1, 2 do  -- one report per file, as often as asked
      local reports = loader:skip_reports()
      expect_eq(#reports, 1)
      expect_eq(reports[1].path, folder .. "/b.jpg")
      expect_eq(reports[1].message, folder .. "/b.jpg: not a JPEG or PNG image (unrecognised first bytes)")
    end
  end)

  it("names the sample when a crop does not fit", function()
    local loader = data.loader(data.shapes { size = 16, count = 4 }, { batch = 2, workers = 1, transform = { crop = 20 } })
    expect_error(function() loader:next() end,
      here(-1) .. "shapes image ", true)
    expect_error(function() loader:next() end, "is 16x16, smaller than the crop 20x20 (add resize to the transform)", true)
  end)

  it("checks options", function()
    local ds = data.shapes { size = 8, count = 4 }
    expect_error(function() data.loader(ds, { batch = 2, transform = { size = 3 } }) end,
      here(-1) .. "unknown option 'size' to 'transform' (known: crop, fast_decode, flip, normalize, random_crop, resize)")
    expect_error(function() data.loader(ds, { batch = 2, transform = { crop = 3, random_crop = 3 } }) end,
      here(-1) .. "transform takes either 'crop' (center) or 'random_crop', not both")
    expect_error(function() data.loader(ds, { batch = 0 }) end, here() .. "loader: batch must be at least 1, got 0")
    expect_error(function() data.loader(ds, { batch = 8, drop_last = true }) end,
      here(-1) .. "loader: 4 samples make no full batch of 8 with drop_last")
    expect_error(function() data.image_folder { path = test.tmp .. "/no-such-dir" } end,
      here(-1) .. test.tmp .. "/no-such-dir: no such directory")
  end)
end)

describe("lua datasets", function()
  it("stacks what get(i) returns, with labels, on the calling thread", function()
    local ds = data.dataset { length = 5, get = function(i) return torch.full({ 2 }, i * 10), i % 2 end }
    expect_eq(#ds, 5)
    local loader = data.loader(ds, { batch = 5, shuffle = false, workers = 4 })
    local batch = loader:next()
    expect_list(batch.data.shape, { 5, 2 })
    expect_list(batch.data:reshape(-1):tolist(), { 10, 10, 20, 20, 30, 30, 40, 40, 50, 50 })
    expect_list(batch.label:tolist(), { 1, 0, 1, 0, 1 })
    expect_eq(loader:stats().workers, 0)
  end)

  it("reports a bad return value and a Lua error at their lines", function()
    local bad = data.loader(data.dataset { length = 2, get = function() return "x" end }, { batch = 2, shuffle = false })
    expect_error(function() bad:next() end, "get(1) returned string, expected a tensor", true)
    local failing = data.loader(data.dataset { length = 2, get = function(i) error("no sample " .. i) end }, { batch = 2, shuffle = false })
    expect_error(function() failing:next() end, here(-1) .. "no sample 1")
  end)
end)

describe("memory and measurement", function()
  local function rss_mib()
    for line in io.lines("/proc/self/status") do
      local kib = line:match("^VmRSS:%s+(%d+)")
      if kib then return tonumber(kib) / 1024 end
    end
  end

  it("stays bounded with many workers and reports its statistics", function()
    local ds = data.shapes { size = 64, count = 512, seed = 2 }
    local loader = data.loader(ds, { batch = 64, workers = 8, prefetch = 8 })
    for _ = 1, 5 do loader:next() end
    collectgarbage()
    local before = rss_mib()
    for _ = 1, 60 do loader:next() end  -- 60 x 3 MiB of float batches
    collectgarbage()
    local grown = rss_mib() - before
    expect_true(grown < 100, string.format("resident memory grew by %.0f MiB", grown))
    local stats = loader:stats()
    expect_eq(stats.batches, 65)
    expect_eq(stats.samples, 65 * 64)
    expect_eq(stats.workers, 8)
    expect_true(stats.queue_depth <= 8, "queue depth within prefetch")
    expect_true(stats.wait_s >= 0 and stats.wait_s <= stats.elapsed_s, "wait time within elapsed time")
    expect_true(stats.images_per_s > 0, "images per second")
  end)

  it("counts every batch ready for a consumer that the workers keep ahead of", function()
    local loader = data.loader(data.shapes { size = 8, count = 64, seed = 2 }, { batch = 4, workers = 1, prefetch = 3 })
    loader:next()
    local depth
    for _ = 1, 20 do  -- the worker makes the next 3 batches while the consumer waits
      os.execute("sleep 0.25")
      loader:next()
      depth = loader:stats().queue_depth
      if depth == 3 then break end
    end
    expect_eq(depth, 3)
  end)
end)
