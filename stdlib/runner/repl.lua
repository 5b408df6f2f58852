-- The REPL's helpers: help() from the ---@meta stubs, Tab completion (app/repl.cpp asks complete()), and the
-- methods a value has.
local stubs = require("runner.stubs")

local M = {}

local keywords = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
                   "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }

local function is_name(key)
  return type(key) == "string" and key:match("^[%a][%w_]*$") ~= nil
end

-- Built-in modules share one method table; their metatable's __has_method says which of it a module has.
local function has_method(value, name)
  local meta = getmetatable(value)
  local check = type(meta) == "table" and rawget(meta, "__has_method")
  return not check or check(value, name)
end

-- The names a value offers after `value.` (functions_only: after `value:`): its own keys (a table's), then
-- those of its metatable's `methods` table, its __index tables and a Lua module's class, down the chain.
local function members(value, functions_only)
  local names, seen = {}, {}
  local function add_keys(t)
    for key, member in pairs(t) do
      if is_name(key) and not seen[key] and (not functions_only or type(member) == "function")
          and (type(member) ~= "function" or has_method(value, key)) then
        seen[key] = true
        names[#names + 1] = key
      end
    end
  end
  if type(value) == "table" then add_keys(require("runner.config").values(value)) end
  local current = value
  for _ = 1, 8 do
    local meta = getmetatable(current)
    if type(meta) ~= "table" then break end
    if type(rawget(meta, "methods")) == "table" then add_keys(rawget(meta, "methods")) end
    local index = rawget(meta, "__index")
    if type(index) ~= "table" then index = rawget(meta, "__class") end
    if type(index) ~= "table" then break end
    add_keys(index)
    current = index
  end
  table.sort(names)
  return names
end

-- The methods `value` has (those `value:` completes), sorted.
function M.methods(value)
  return members(value, true)
end

-- Tab completion of `text` (a name, or a chain a.b.c ending in `.partial` or `:partial`): the whole words. Names
-- are looked up in `scope` (default the globals; runner attach's scope holds a script's locals and then the globals).
function M.complete(text, scope)
  scope = scope or _G
  local base, separator, partial = text:match("^(.-)([%.:]?)([%w_]*)$")
  local matches = {}
  if base == nil then return matches end
  local function offer(names, prefix)
    for _, name in ipairs(names) do
      if name:sub(1, #partial) == partial then matches[#matches + 1] = prefix .. name end
    end
  end
  if separator == "" then
    offer(members(scope, false), "")
    offer(keywords, "")
    return matches
  end
  -- Only a chain of names is resolved: `("x"):` or `f().` complete nothing rather than globals.
  if not base:match("^[%a_][%w_]*$") and not base:match("^[%a_][%w_]*%.[%w_%.]*[%w_]$") then return matches end
  local value = scope
  for field in base:gmatch("[^%.]+") do
    local kind = type(value)
    if (kind ~= "table" and kind ~= "userdata") or not field:match("^[%a_][%w_]*$") then return matches end
    value = value[field]
    if value == nil then return matches end
  end
  offer(members(value, separator == ":"), base .. separator)
  return matches
end

-- help -----------------------------------------------------------------------------------------------------

local function last_part(name)
  return name:match("([^%.:]+)$")
end

-- The value a documented name has at run time (a method "Class:m" through its metatable), or nil.
local class_metatables = { Tensor = "runner.Tensor", Module = "runner.NativeModule", Denoiser = "runner.NativeModule",
                           AutoencoderKL = "runner.NativeModule" }
local function runtime_value(name)
  local class, method = name:match("^([%w_]+):([%w_]+)$")
  if class then
    local meta = debug.getregistry()[class_metatables[class] or ("runner." .. class)]
    if type(meta) ~= "table" then return nil end
    for _, key in ipairs({ "methods", "__index" }) do
      local methods = rawget(meta, key)
      if type(methods) == "table" and rawget(methods, method) ~= nil then return rawget(methods, method) end
    end
    return nil
  end
  local value = _G
  for field in name:gmatch("[^%.]+") do
    if type(value) ~= "table" then return nil end
    value = rawget(value, field)
  end
  return value
end

local runner_roots = { torch = true, nn = true, optim = true, runner = true, config = true, help = true }

-- The documented name of a function or table, else its name in torch, nn, optim, runner or the globals.
local function name_of(subject, index)
  for _, entry in ipairs(index.entries) do
    if entry.kind ~= "alias" and runtime_value(entry.name) == subject then return entry.name end
  end
  local seen = {}
  local function search(t, prefix, depth)
    if seen[t] or depth > 3 then return nil end
    seen[t] = true
    for key, value in pairs(t) do
      if is_name(key) then
        if value == subject then return prefix .. key end
        if type(value) == "table" then
          local found = search(value, prefix .. key .. ".", depth + 1)
          if found then return found end
        end
      end
    end
  end
  for _, root in ipairs({ "torch", "nn", "optim", "runner" }) do
    local found = search(_G[root], root .. ".", 1)
    if found then return found end
  end
  return search(_G, "", 2)
end

-- The documented class of an object: its metatable's __name, else the class whose documented methods it has
-- (the most specific one).
local function class_of(object, index)
  local meta = getmetatable(object)
  local name = type(meta) == "table" and rawget(meta, "__name")
  if name == "runner.NativeModule" then
    if has_method(object, "set_checkpointing") then return index.by_name.Denoiser end
    if has_method(object, "encode") then return index.by_name.AutoencoderKL end
    return index.by_name.Module
  end
  if nn.is_module(object) then return index.by_name.Module end
  if type(name) == "string" then
    local entry = index.by_name[name:gsub("^runner%.", "")]
    if entry and entry.kind == "class" then return entry end
  end
  local has = {}
  for _, method in ipairs(M.methods(object)) do has[method] = true end
  local own = {}
  for _, entry in ipairs(index.entries) do
    local class, method = entry.name:match("^([%w_]+):([%w_]+)$")
    if class then
      own[class] = own[class] or { all = true, count = 0 }
      own[class].all = own[class].all and has[method] == true
      own[class].count = own[class].count + 1
    end
  end
  local best, best_count
  for class, methods in pairs(own) do
    if methods.all then
      local count, entry = 0, index.by_name[class]
      while entry do
        count = count + (own[entry.name] and own[entry.name].count or 0)
        entry = entry.parent and index.by_name[entry.parent]
      end
      if index.by_name[class] and (not best or count > best_count) then best, best_count = index.by_name[class], count end
    end
  end
  return best
end

local function wrapped(prefix, names)
  local lines, line = {}, prefix
  for i, name in ipairs(names) do
    local piece = name .. (i < #names and ", " or "")
    if #line + #piece > 100 and line ~= prefix then
      lines[#lines + 1] = (line:gsub("%s+$", ""))
      line = string.rep(" ", #prefix)
    end
    line = line .. piece
  end
  lines[#lines + 1] = line
  return lines
end

local function add_lines(out, lines, indent)
  for _, line in ipairs(lines) do out[#out + 1] = line == "" and "" or indent .. line end
end

local render_class

-- The classes named in a function's @param types that document fields (its options tables).
local function option_classes(entry, index)
  local classes = {}
  for _, tag in ipairs(entry.tags) do
    local type_text = tag:match("^@param%s+%S+%s+(%S+)")
    for name in (type_text or ""):gmatch("[%a_][%w_%.]*") do
      local class = index.by_name[name]
      if class and class.kind == "class" and #class.tags > 0 then classes[#classes + 1] = class end
    end
  end
  return classes
end

local function render_function(entry, index, out, shown)
  out[#out + 1] = entry.signature
  add_lines(out, entry.doc, "  ")
  add_lines(out, entry.tags, "  ")
  out[#out + 1] = "  -- " .. entry.file .. ":" .. entry.line
  for _, class in ipairs(option_classes(entry, index)) do
    if not shown[class] then
      shown[class] = true
      out[#out + 1] = ""
      render_class(class, index, out, shown)
    end
  end
end

-- The documented functions directly under a namespace ("torch" -> torch.zeros, ...) or methods of a class.
local function documented_members(name, separator, index)
  local names = {}
  for _, entry in ipairs(index.entries) do
    local prefix = name .. separator
    if entry.kind == "function" and entry.name:sub(1, #prefix) == prefix and not entry.name:sub(#prefix + 1):find("[%.:]") then
      names[#names + 1] = entry.name:sub(#prefix + 1)
    end
  end
  return names
end

render_class = function(entry, index, out, shown, object)
  out[#out + 1] = entry.name .. (entry.parent and ": " .. entry.parent or "")
  add_lines(out, entry.doc, "  ")
  for _, tag in ipairs(entry.tags) do out[#out + 1] = "  " .. tag:gsub("^@field%s+", "") end
  local functions = documented_members(entry.name, ".", index)
  if #functions > 0 then add_lines(out, wrapped("functions: ", functions), "  ") end
  local class = entry
  while class do
    local methods = documented_members(class.name, ":", index)
    if object ~= nil then
      local has, kept = {}, {}
      for _, method in ipairs(M.methods(object)) do has[method] = true end
      for _, method in ipairs(methods) do
        if has[method] then kept[#kept + 1] = method end
      end
      methods = kept
    end
    if #methods > 0 then
      add_lines(out, wrapped(class == entry and "methods: " or class.name .. " methods: ", methods), "  ")
    end
    class = class.parent and index.by_name[class.parent]
  end
  out[#out + 1] = "  -- " .. entry.file .. ":" .. entry.line
end

local function render(entry, index, out, shown, object)
  shown[entry] = true
  if entry.kind == "function" then
    render_function(entry, index, out, shown)
  elseif entry.kind == "class" then
    render_class(entry, index, out, shown, object)
  else
    out[#out + 1] = entry.name
    add_lines(out, entry.doc, "  ")
    add_lines(out, entry.tags, "  ")
    out[#out + 1] = "  -- " .. entry.file .. ":" .. entry.line
  end
end

-- help "name": a documented name, else the names whose last part is it (and the options table it names).
local function search(query, index, out)
  local entry = index.by_name[query]
  if entry then return render(entry, index, out, {}) end
  local wanted = query:lower()
  local found = {}
  for _, candidate in ipairs(index.entries) do
    local name = candidate.name:lower()
    if last_part(name) == wanted or name == wanted .. "options" then found[#found + 1] = candidate end
  end
  local rank = { ["function"] = 1, class = 2 }
  for i, candidate in ipairs(found) do candidate.order = i end
  table.sort(found, function(a, b)
    local ra, rb = rank[a.kind] or 3, rank[b.kind] or 3
    if ra ~= rb then return ra < rb end
    return a.order < b.order
  end)
  local shown = {}
  for _, candidate in ipairs(found) do
    if not shown[candidate] then
      if #out > 0 then out[#out + 1] = "" end
      render(candidate, index, out, shown)
    end
  end
  if #found > 0 then return end
  local containing = {}
  for _, candidate in ipairs(index.entries) do
    if candidate.name:lower():find(wanted, 1, true) then containing[#containing + 1] = candidate.name end
  end
  if #containing == 0 then
    out[#out + 1] = string.format('help: nothing documented is named "%s" or contains it', query)
  else
    add_lines(out, wrapped(string.format('help: nothing is named "%s"; documented names containing it: ', query),
      containing), "")
  end
end

--- help(value) or help "name": prints the documentation of a runner function, class, namespace or object.
function M.help(...)
  local out = {}
  local index = stubs.index()
  if select("#", ...) == 0 then
    out[1] = 'help(value) or help "name": the documentation of a runner function, class, object or options table'
    out[2] = '(e.g. help(torch.randn), help(nn.DiT), help(model), help "trainer"), from the stubs in stdlib/meta.'
  else
    local subject = ...
    local kind = type(subject)
    if kind == "string" then
      search(subject, index, out)
    elseif kind == "function" or kind == "table" or kind == "userdata" then
      local name = name_of(subject, index)
      local entry = name and (index.by_name[name] or index.by_name[name:gsub("^torch%.", "Tensor:")])
      local class = not entry and kind ~= "function" and class_of(subject, index)
      if entry then
        render(entry, index, out, {})
      elseif class then
        render(class, index, out, {}, subject)
      elseif name and not runner_roots[name:match("^[%w_]+")] then
        out[1] = "help: " .. name .. " is Lua's own (the Lua 5.1 reference manual documents it), not runner's"
      elseif name then
        out[1] = "help: " .. name .. " has no documentation in stdlib/meta"
      elseif kind == "function" then
        local info = debug.getinfo(subject, "S")
        if info.what == "Lua" then
          out[1] = string.format("help: a function defined at %s:%d, not one of runner's: nothing is documented for it",
            info.short_src, info.linedefined)
        else
          out[1] = "help: this function has no documentation"
        end
      else
        out[1] = "help: this " .. kind .. " is not a documented runner namespace, class or object"
      end
    elseif subject == nil then
      out[1] = 'help: the value is nil (a misspelt name?); help "name" searches the documented names'
    else
      out[1] = "help: a " .. kind .. " has no documentation"
    end
  end
  print(table.concat(out, "\n"))
end

return M
