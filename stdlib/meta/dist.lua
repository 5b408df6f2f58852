---@meta
-- runner.dist: data-parallel training. The same script runs as one process or as several ranks, started by
-- `runner --nproc N script.lua` (this host), torchrun (`torchrun --no-python --nproc-per-node N runner
-- script.lua`, one or more nodes) or Slurm (`srun runner script.lua`). With more than one rank the trainer
-- is data parallel by itself: rank 0's weights are copied to every rank at its start, each rank takes its
-- share of every global batch (the loader's `batch` is the global batch), gradients are averaged over the
-- ranks after the last micro-batch, and the step's loss is the mean over the ranks (the learning rate is that of
-- the global batch, whatever the number of ranks; at its first step rank 0 logs the split, e.g. "data parallel:
-- 2 ranks, global batch 32 = 2 x 16"). Rank 0 records the run
-- (index row, metrics, images, checkpoints); the other ranks' run:log, run:images and run:checkpoint do
-- nothing. A stop signal on any rank stops every rank after the same step. Ranks count from 0, as RANK does.
-- In a single process rank is 0, world_size 1, and the collectives return their input.

runner.dist = {}

---@type integer  this process's rank, 0 .. world_size - 1 (RANK, or SLURM_PROCID)
runner.dist.rank = 0
---@type integer  the number of ranks (WORLD_SIZE, or SLURM_NTASKS)
runner.dist.world_size = 1
---@type integer  the rank on this node, which picks its GPU for device "auto" (LOCAL_RANK, or SLURM_LOCALID)
runner.dist.local_rank = 0
---@type integer  ranks on this node (LOCAL_WORLD_SIZE, or SLURM_NTASKS_PER_NODE)
runner.dist.local_world_size = 1
---@type boolean  rank == 0: the rank that prints, records and saves
runner.dist.is_main = true

--- Waits until every rank has called it.
function runner.dist.barrier() end

--- Reduces `t` over the ranks in place (CPU tensors over Gloo, CUDA tensors over NCCL) and returns it.
---@param t Tensor            contiguous, the same shape and dtype on every rank
---@param op? "sum"|"mean"|"max"|"min"  default "sum"
---@return Tensor t
function runner.dist.all_reduce(t, op) end

--- Sets `t` on every rank to rank `root`'s values, in place, and returns it.
---@param t Tensor            contiguous, the same shape and dtype on every rank
---@param root? integer       default 0
---@return Tensor t
function runner.dist.broadcast(t, root) end

--- Every rank's `t`, in rank order: { rank 0's, rank 1's, ... }. torch.cat(runner.dist.all_gather(x)) joins
--- samples that each rank drew for its share.
---@param t Tensor            the same shape and dtype on every rank
---@return Tensor[]
function runner.dist.all_gather(t) end
