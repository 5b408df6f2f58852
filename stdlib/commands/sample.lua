-- runner [--nproc N] sample RUN [options]: samples of a run's checkpoint (runner.load_run) drawn with its objective's
-- sampler in batches keyed by their index, so any number of ranks draws the same samples and a killed command
-- continues where it stopped; written as an .npz for the DiT/ADM evaluators and a PNG grid, scored, and recorded
-- against the run.
local usage = [[
usage: runner [--nproc N] sample RUN [options]
  draws samples of run RUN's checkpoint with the objective it trained (DDPM or flow matching), as the run's own
  objective:sample would with the same settings: batch k (samples k*B+1 .. (k+1)*B) is
  objective:sample(model, {n = B, seed = SEED + k, labels = ..., ...}). Each rank draws its share of the batches
  (--nproc N, torchrun, srun: the same samples for any number of ranks); the same command after a kill continues
  with the batches not yet written.
options:
  --checkpoint STEP   the checkpoint (default: the newest good one)
  --raw               the trained weights instead of the EMA's
  --n N               samples to draw (default 64)
  --batch B           samples per batch (default 32)
  --seed S            batch k is drawn with seed S + k (default 0)
  --steps S           sampling steps (default: the sampler's)
  --sampler NAME      e.g. ddim, ddpm (DDPM), euler, heun, dopri5 (flow; default: the objective's)
  --guidance G        classifier-free guidance scale (default 1)
  --sde               flow matching: the SDE sampler
  --labels L          class-conditional models: a class id, a comma-separated list (sample i takes entry i mod the
                      count), or by default sample i takes class i mod the classes
  --fid REF.npz       score the samples by FID against REF (mu and sigma, e.g. runner data fid-stats) with
  --fid-weights PATH  the FID Inception weights (runner.eval.fid); needs 3-channel images
  --out DIR           where the files go (default: RUN's folder, samples/step-N-<settings>/)
  --device D          where to sample (default auto)
writes: DIR/samples.npz (arr_0: uint8 [N, H, W, C] images, arr_1: int64 labels, as the ADM evaluator reads),
  DIR/grid.png (the first 64), DIR/parts/ (one file per batch); records the scores (sample/fid) as the run's
  metrics at the checkpoint's step and the grid as its image, for runner show, runner runs --metrics and the
  dashboard. A run whose config has a vae (the latent DiT) is decoded with it.]]

local values = { ["--checkpoint"] = true, ["--n"] = true, ["--batch"] = true, ["--seed"] = true, ["--steps"] = true,
                 ["--sampler"] = true, ["--guidance"] = true, ["--labels"] = true, ["--fid"] = true,
                 ["--fid-weights"] = true, ["--out"] = true, ["--device"] = true }
local flags = { ["--raw"] = true, ["--sde"] = true }

local options, run_reference = {}, nil
local i = 1
while i <= #arg do
  local word = arg[i]
  if word == "-h" or word == "--help" then
    print(usage)
    os.exit(0)
  elseif values[word] then
    if arg[i + 1] == nil then runner.usage_error(string.format("sample: %s needs a value", word)) end
    options[word:sub(3)] = arg[i + 1]
    i = i + 1
  elseif flags[word] then
    options[word:sub(3)] = true
  elseif word:sub(1, 1) == "-" then
    runner.usage_error(string.format("sample: unknown option '%s' (runner sample --help)", word))
  elseif run_reference == nil then
    run_reference = word
  else
    runner.usage_error(string.format("sample: one RUN, got '%s' and '%s'", run_reference, word))
  end
  i = i + 1
end
if run_reference == nil then runner.usage_error("sample: which run? runner sample RUN [options] (--help)") end

local function whole(name, low)
  local text = options[name]
  if text == nil then return nil end
  local value = tonumber(text)
  if value == nil or value % 1 ~= 0 or value < low then
    runner.usage_error(string.format("sample: --%s must be a whole number >= %d, got '%s'", name, low, text))
  end
  return value
end
local function number(name)
  local text = options[name]
  if text == nil then return nil end
  local value = tonumber(text)
  if value == nil then runner.usage_error(string.format("sample: --%s must be a number, got '%s'", name, text)) end
  return value
end
local n, batch, seed = whole("n", 1) or 64, whole("batch", 1) or 32, whole("seed", 0) or 0
local steps, guidance = whole("steps", 1), number("guidance")
if (options.fid == nil) ~= (options["fid-weights"] == nil) then
  runner.usage_error("sample: --fid REF.npz and --fid-weights PATH go together")
end

local loaded = runner.load_run(run_reference, { checkpoint = whole("checkpoint", 0), ema = not options.raw,
                                                device = options.device })
local objective, model = loaded.objective, loaded.model
if objective == nil then
  error(string.format("sample: run %s's trainer has no runner.diffusion objective to sample with", loaded.run.name), 0)
end
local info = model.info and model:info() or error(string.format(
  "sample: run %s's model is not a built-in UNet or DiT, whose shape runner sample knows", loaded.run.name), 0)

-- The class of each sample, 0-based sample index i.
local label_of
if info.classes > 0 then
  local list = {}
  for item in (options.labels or ""):gmatch("[^,]+") do
    local class = tonumber(item)
    if class == nil or class % 1 ~= 0 or class < 0 or class >= info.classes then
      runner.usage_error(string.format("sample: --labels: '%s' is not a class of the model (0 .. %d)", item,
        info.classes - 1))
    end
    list[#list + 1] = class
  end
  label_of = #list > 0 and function(index) return list[index % #list + 1] end
    or function(index) return index % info.classes end
elseif options.labels then
  runner.usage_error(string.format("sample: --labels given, but run %s's model is unconditional", loaded.run.name))
end

-- The settings that decide the samples: a resumed command must have the same.
local settings = { string.format("run=%s", loaded.run.id), string.format("step=%d", loaded.step),
                   string.format("weights=%s", options.raw and "trained" or "ema"), string.format("n=%d", n),
                   string.format("batch=%d", batch), string.format("seed=%d", seed) }
for _, key in ipairs { "steps", "sampler", "guidance", "sde", "labels" } do
  if options[key] ~= nil then settings[#settings + 1] = string.format("%s=%s", key, tostring(options[key])) end
end
local settings_text = table.concat(settings, "\n") .. "\n"
local out = options.out
if out == nil then
  local tag = { string.format("step-%07d", loaded.step), "n" .. n, "seed" .. seed }
  if options.raw then tag[#tag + 1] = "raw" end
  for _, key in ipairs { "steps", "sampler", "guidance" } do
    if options[key] then tag[#tag + 1] = key .. options[key] end
  end
  if options.sde then tag[#tag + 1] = "sde" end
  if options.labels then tag[#tag + 1] = "labels" .. options.labels:gsub(",", "-") end
  out = loaded.run.dir .. "/samples/" .. table.concat(tag, "-")
end
local rank, ranks = runner.dist.rank, runner.dist.world_size
local function read_text(path)
  local file = io.open(path, "rb")
  if not file then return nil end
  local text = file:read("*a")
  file:close()
  return text
end
if rank == 0 then
  os.execute(string.format("mkdir -p '%s'", (out .. "/parts"):gsub("'", "'\\''")))
  local before = read_text(out .. "/settings.txt")
  if before and before ~= settings_text then
    error(string.format("sample: %s holds samples of other settings (%s/settings.txt); give another --out", out, out), 0)
  end
  local file = assert(io.open(out .. "/settings.txt", "wb"))
  file:write(settings_text)
  file:close()
end
if ranks > 1 then runner.dist.barrier() end

-- The run's VAE decodes a latent model's samples (its config's vae, as experiments/dit.lua uses it).
local vae, scale, shift
if type(loaded.config.vae) == "string" and loaded.config.vae ~= "" then
  vae = nn.AutoencoderKL.load(loaded.config.vae):to(model:parameters()[1].device)
  scale, shift = vae:info().scaling_factor, vae:info().shift_factor or 0
end

local batches = math.ceil(n / batch)
local function part_path(k) return string.format("%s/parts/batch-%06d.safetensors", out, k) end
local mine, done, drawn_here, start = 0, 0, 0, runner.clock()
for k = rank, batches - 1, ranks do
  mine = mine + 1
  local existing = io.open(part_path(k))
  if existing then existing:close() end
  if existing == nil then
    local first, size = k * batch, math.min(batch, n - k * batch)
    local sample_options = { n = size, seed = seed + k, steps = steps, sampler = options.sampler, guidance = guidance,
                             sde = options.sde or nil }
    if label_of then
      local labels = {}
      for j = 1, size do labels[j] = label_of(first + j - 1) end
      sample_options.labels = labels
    end
    local x = objective:sample(model, sample_options)
    if vae then x = torch.no_grad(function() return vae:decode(x / scale + shift) end) end
    local part = { samples = x:float():cpu() }
    if sample_options.labels then part.labels = torch.tensor(sample_options.labels, { dtype = "int64" }) end
    torch.save(part, part_path(k))
    drawn_here = drawn_here + size
    if rank == 0 then
      local elapsed = runner.clock() - start
      local left = math.floor((batches - 1 - k) / ranks)
      io.stderr:write(string.format("runner sample: batch %d of %d, %.1f samples/s, ETA %.0f s\n", k + 1, batches,
        drawn_here / elapsed, left * elapsed / (mine - done)))
    end
  else
    done = done + 1
  end
end
if ranks > 1 then runner.dist.barrier() end
if rank ~= 0 then os.exit(0) end

local parts, labels = {}, {}
for k = 0, batches - 1 do
  local part = torch.load(part_path(k))
  parts[#parts + 1] = part.samples
  if part.labels then labels[#labels + 1] = part.labels end
end
local samples = torch.cat(parts, 1)
local images = ((samples:clamp(-1, 1) + 1) * 127.5):round():to("uint8"):permute(1, 3, 4, 2):contiguous()
local arrays = { arr_0 = images }
if #labels > 0 then arrays.arr_1 = torch.cat(labels, 1) end
torch.save(arrays, out .. "/samples.npz")
local channels = samples.shape[2]
local scores = {}
if channels == 1 or channels == 3 then
  runner.save_grid(out .. "/grid.png", samples[{ { 1, math.min(64, n) } }], { columns = 8 })
end
if options.fid then
  if channels ~= 3 then error(string.format("sample: FID needs 3-channel images; these have %d channels", channels), 0) end
  scores["sample/fid"] = runner.eval.fid(samples, options.fid, { weights = options["fid-weights"] })
end
local relative = out:sub(1, #loaded.run.dir + 1) == loaded.run.dir .. "/" and out:sub(#loaded.run.dir + 2) or nil
local images_recorded = {}
if relative and (channels == 1 or channels == 3) then
  images_recorded[1] = { name = "sample", path = relative .. "/grid.png" }
end
runner._record_evaluation(loaded.run.id, loaded.step, scores, images_recorded)
local summary = { string.format("%d samples of run %s step %d in %s", n, loaded.run.name, loaded.step, out) }
for key, value in pairs(scores) do summary[#summary + 1] = string.format("%s %.4f", key, value) end
print(table.concat(summary, "; "))
