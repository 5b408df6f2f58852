-- Loaded into every runner Lua state: completes the torch, nn, optim, runner, runner.data and runner.diffusion
-- namespaces, runner.start, runner.query and runner.sweep, defines config and help.
-- The one print: it ends a progress line drawn in place first (so that nothing is written onto its end), then
-- writes, and appends the text to the active run's log file (core::append_to_log_file: nothing without a run).
-- A table without __tostring prints as the REPL shows it (runner.pretty.repr), not as its address.
local plain_print = print
local log_text = runner._run.log_text
local function printed(value)
  if type(value) == "table" then
    local meta = getmetatable(value)
    if not (type(meta) == "table" and rawget(meta, "__tostring")) then return runner.pretty.repr(value) end
  end
  return tostring(value)
end
function print(...)
  runner._end_open_line()
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = printed((select(i, ...))) end
  plain_print(unpack(parts, 1, select("#", ...)))
  log_text(table.concat(parts, "\t"))
end
-- pairs honours a metatable's __pairs, as Lua 5.2 does (LuaJIT's own does not): config {}'s proxy walks its values.
-- It returns the built-in next for plain tables, so LuaJIT still compiles the loops over them.
local plain_pairs = pairs
function pairs(t)
  local meta = getmetatable(t)
  local walk = type(meta) == "table" and rawget(meta, "__pairs")
  if walk then return walk(t) end
  return plain_pairs(t)
end
require("runner.nn")
require("runner.optim")
require("runner.data")
runner.diffusion = require("runner.diffusion")
runner.pretty = require("runner.pretty")
require("runner.run")
require("runner.train")
runner.sweep = require("runner.sweep")
config = require("runner.config").declare
help = require("runner.repl").help

local log_message = runner.log
runner.log = {}
for _, level in ipairs({ "trace", "debug", "info", "warn", "error" }) do
  runner.log[level] = function(format, ...)
    if select("#", ...) > 0 then
      log_message(level, string.format(format, ...))
    else
      log_message(level, tostring(format))
    end
  end
end
