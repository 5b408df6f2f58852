-- A sweep over the quickstart's learning rate, batch size and EMA decay: 12 trials chosen by TPE, and ASHA
-- stops the weaker ones at 100 and 300 steps (each trial logs its sample quality, swd, every 100 steps).
-- Every trial is a run of quickstart.lua with key=value overrides, recorded in the index with its trial number.
--   runner sweep experiments/sweep_quickstart.lua            (Ctrl-C stops it; the same command continues it)
--   runner sweep show sweep_quickstart                       (trials by swd, the best one's command line)
--   runner sweep --dry-run experiments/sweep_quickstart.lua  (check it and show the first trials)
return runner.sweep {
  script = "quickstart.lua",
  parameters = {
    lr = runner.sweep.log_uniform(5e-4, 5e-3),
    batch = { 32, 64 },
    ema = runner.sweep.uniform(0.99, 0.998),
  },
  fixed = { steps = 600, sample_every = 100, metric_samples = 128 },
  method = "tpe",
  trials = 12,
  metric = "swd",
  mode = "min",
  prune = { "asha", min_steps = 100, reduction = 3 },
  slots = "auto",
}
