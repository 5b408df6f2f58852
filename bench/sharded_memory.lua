-- Runner side of bench/sharded_memory.py: a DiT trained for a step or two on random latents, in one process or as
-- one rank of `runner --nproc N`, with shard = none | optimizer | gradients | weights; every rank's `train:state_bytes()` and
-- peak RSS are gathered to rank 0, which prints `RESULT {json}` (only rank 0's stdout reaches the terminal).
--   build/runner bench/sharded_memory.lua model=S
--   OMP_NUM_THREADS=1 build/runner --nproc 2 bench/sharded_memory.lua model=B shard=gradients steps=1
local cfg = config {
  model = "S",          -- S (DiT-S/2) or B (DiT-B/2), or any DiT preset name ("DiT-L/4")
  shard = "none",       -- none, optimizer (ZeRO-1), gradients (ZeRO-2) or weights (ZeRO-3)
  batch = 2,            -- per rank: the global batch is batch x ranks
  steps = 1,            -- training steps before the state is measured
  device = "cpu",
  seed = 0,
}
local dist = runner.dist
local size = cfg.model:find("^DiT%-") and cfg.model or "DiT-" .. cfg.model .. "/2"
local preset, size_error = nn.dit_size(size)
if not preset then runner.usage_error("model=" .. cfg.model .. ": " .. size_error) end
if cfg.steps < 1 or cfg.batch < 1 then runner.usage_error("steps and batch must be at least 1") end
torch.manual_seed(cfg.seed + dist.rank)

-- This process's memory in bytes from /proc/self/status: "VmRSS" now, "VmHWM" its peak since runner started; nil
-- without /proc
local function process_memory_bytes(field)
  local status = io.open("/proc/self/status", "r")
  if not status then return nil end
  local text = status:read("*a")
  status:close()
  local kib = text:match(field .. ":%s*(%d+) kB")
  return kib and tonumber(kib) * 1024 or nil
end
local start_rss = process_memory_bytes("VmRSS") or 0  -- LibTorch and Lua loaded, no model yet

local model = nn.DiT { size = size, image = 32, in_channels = 4, classes = 1000, learn_sigma = true }
model:to(cfg.device)
local trainable, root = 0, 0  -- root: the parameters outside the blocks (kept whole by shard = "weights")
for name, p in model:named_parameters() do
  if p.requires_grad then trainable = trainable + p:numel() end
  if not name:find("^blocks%.") then root = root + p:numel() end
end
local ddpm = runner.diffusion.gaussian { timesteps = 1000, schedule = "linear", seed = cfg.seed }
-- No ema_model: the averages live in the trainer's shadows (what state_bytes counts); a model to read them
-- into would add 4 bytes per parameter of RSS on every rank.
local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-4, weight_decay = 0 }, clip = 1.0,
                               objective = ddpm:objective(model), ema = 0.9999, amp = "fp32", shard = cfg.shard,
                               steps = cfg.steps, batch = cfg.batch * dist.world_size, progress = false }
local batch = { data = torch.randn(cfg.batch, 4, 32, 32, { device = cfg.device }),
                label = torch.randint(0, 1000, { cfg.batch }, { device = cfg.device }) }
local before = train:state_bytes()  -- optimizer: what it will hold
local loss
local began = runner.clock()
for _ = 1, cfg.steps do loss = train:step(batch).loss end
local last = loss:item()
local seconds = runner.clock() - began
local after = train:state_bytes()

-- Every rank's numbers to rank 0 (float64 holds byte counts exactly)
local fields = { "weights", "gradients", "optimizer", "ema", "total", "optimizer_before", "peak_rss", "start_rss",
                 "end_rss" }
local mine = torch.tensor({ after.weights, after.gradients, after.optimizer, after.ema, after.total, before.optimizer,
                            process_memory_bytes("VmHWM") or 0, start_rss, process_memory_bytes("VmRSS") or 0 },
                          { dtype = "float64" })
local gathered = dist.all_gather(mine)
if dist.is_main then
  local ranks = {}
  for r, t in ipairs(gathered) do
    local values = t:tolist()
    local parts = {}
    for i, name in ipairs(fields) do parts[i] = string.format('"%s": %.0f', name, values[i]) end
    ranks[r] = string.format('{"rank": %d, %s}', r - 1, table.concat(parts, ", "))
  end
  print(string.format('RESULT {"model": "%s", "shard": "%s", "world_size": %d, "batch_per_rank": %d, "steps": %d, ' ..
    '"parameters": %d, "trainable": %d, "root": %d, "seconds": %.4f, "loss": %.6f, "precision": "%s", ' ..
    '"threads": %d, "ranks": [%s]}', size, cfg.shard, dist.world_size, cfg.batch, cfg.steps, model:num_parameters(),
    trainable, root,
    seconds, last, train:precision(), torch.get_num_threads(), table.concat(ranks, ", ")))
end
