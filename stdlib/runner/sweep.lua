-- runner.sweep { ... }: the definition a sweep file returns for `runner sweep FILE.lua`, and the search-space
-- constructors (uniform, log_uniform, int, choice). The definition is checked by the runtime (runtime/sweep),
-- whose errors name the line of this file's caller where the field or parameter is given.
local M = {}

local function space(kind, fields)
  fields.kind = kind
  return fields
end

function M.uniform(low, high) return space("uniform", { low = low, high = high }) end
function M.log_uniform(low, high) return space("log_uniform", { low = low, high = high }) end
function M.choice(values)
  if type(values) ~= "table" then error("runner.sweep.choice expects a list of values", 2) end
  return space("choice", { values = values })
end
local sweep_int_options = runner._sweep_int_options
runner._sweep_int_options = nil
function M.int(low, high, options)
  local step, log = sweep_int_options(options)
  return space("int", { low = low, high = high, step = step, log = log })
end

-- The line where `key = ` first appears in `text` at or after line `from`, as "path:line"; else nil.
local function line_of(lines, from, key, path)
  local pattern = "%f[%w_]" .. key:gsub("%p", "%%%0") .. "%f[^%w_]%s*="
  for number = from, #lines do
    if lines[number]:find(pattern) then return path .. ":" .. number end
  end
  return nil
end

local function source_lines(source)
  local text = source
  if source:sub(1, 1) == "@" then
    local file = io.open(source:sub(2), "rb")
    if not file then return {} end
    text = file:read("*a")
    file:close()
  end
  local lines = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  return lines
end

setmetatable(M, {
  __call = function(_, fields)
    if type(fields) ~= "table" then error("runner.sweep expects a table: runner.sweep { script = ..., parameters = ... }", 2) end
    -- `return runner.sweep { ... }` is a tail call, which leaves no frame of the caller: then the file is the
    -- sweep file the host is reading, and the call is its first line naming runner.sweep.
    local info = debug.getinfo(2, "Sl")
    local source, first
    if info and info.source:sub(1, 1) == "@" then
      source, first = info.source, info.currentline
    elseif runner._sweep_file then
      source = "@" .. runner._sweep_file
    else
      source = info and info.source or "=?"
    end
    local path = source:sub(2)
    local lines, where_of = source_lines(source), {}
    local call = "runner%.sweep%s*[{(]"
    if first then  -- a call spread over lines may report its last line: back up to the one that makes it
      while first > 1 and lines[first] and not lines[first]:find(call) do first = first - 1 end
    else
      first = 1
      while lines[first] and not lines[first]:find(call) do first = first + 1 end
    end
    if not lines[first] then first = 1 end
    local where = path .. ":" .. first
    local copy = {}
    for key, value in pairs(fields) do copy[key] = value end
    if type(copy.prune) == "table" and copy.prune[1] ~= nil then
      local prune = {}
      for key, value in pairs(copy.prune) do prune[key] = value end
      prune.method, prune[1] = prune[1], nil
      copy.prune = prune
    end
    local function note(key, prefix)
      if type(key) == "string" then where_of[(prefix or "") .. key] = line_of(lines, first, key, path) or where end
    end
    for key in pairs(copy) do note(key) end
    if type(copy.parameters) == "table" then
      for key in pairs(copy.parameters) do note(key) end
    end
    if type(copy.fixed) == "table" then  -- as "fixed.<key>": a fixed key may share a field's name
      for key in pairs(copy.fixed) do note(key, "fixed.") end
    end
    return { kind = "runner.sweep", sweep_file = path, where = where, lines = where_of, fields = copy }
  end,
})

return M
