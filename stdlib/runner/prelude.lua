-- Loaded into every runner Lua state: completes the torch, nn, optim, runner and runner.data namespaces, defines config.
require("runner.nn")
require("runner.optim")
require("runner.data")
runner.pretty = require("runner.pretty")
config = require("runner.config").declare

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
