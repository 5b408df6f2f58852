-- config { key = default, ... }: declares a script's settings; key=value on the command line overrides them.
local M = {}

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

local function type_description(value)
  if type(value) == "table" then
    return "a comma-separated list of " .. (type(value[1]) == "string" and "strings" or "numbers")
  end
  return ({ number = "a number", boolean = "true or false", string = "a string" })[type(value)]
end

-- Keys whose default the script writes as an integer literal (steps = 600; not 600.0 or 6e2) take whole
-- numbers only. The script's text is read from the line of the config {} call at stack `level` on.
local function integer_keys(defaults, level)
  local integers = {}
  local info = debug.getinfo(level + 1, "Sl")
  if not info or not info.currentline or info.currentline < 1 then return integers end
  local text = info.source
  if text:sub(1, 1) == "@" then
    local file = io.open(text:sub(2), "rb")
    if not file then return integers end
    text = file:read("*a")
    file:close()
  end
  local position = 1
  for _ = 2, info.currentline do
    position = text:find("\n", position, true)
    if not position then return integers end
    position = position + 1
  end
  local body = text:sub(position)
  for key, value in pairs(defaults) do
    if type(key) == "string" and type(value) == "number" and value == math.floor(value) then
      local literal = body:match("%f[%w_]" .. key:gsub("%p", "%%%0") .. "%f[^%w_]%s*=%s*(%-?[%w%.]+)")
      if literal and (literal:match("^%-?%d+$") or literal:match("^%-?0[xX]%x+$")) then integers[key] = true end
    end
  end
  return integers
end

local function parse_scalar(default, text)
  local kind = type(default)
  if kind == "number" then
    return tonumber(text)
  elseif kind == "boolean" then
    local booleans = { ["true"] = true, yes = true, on = true, ["1"] = true,
                       ["false"] = false, no = false, off = false, ["0"] = false }
    return booleans[text:lower()]
  elseif kind == "string" then
    return text
  end
end

local function parse_value(default, text)
  if type(default) ~= "table" then return parse_scalar(default, text) end
  local element = default[1] ~= nil and default[1] or 0
  local values = {}
  for item in (text .. ","):gmatch("([^,]*),") do
    local value = parse_scalar(element, item:match("^%s*(.-)%s*$"))
    if value == nil then return nil end
    values[#values + 1] = value
  end
  return values
end

local function format_value(value)
  if type(value) == "table" then
    local items = {}
    for i, v in ipairs(value) do items[i] = tostring(v) end
    return "{" .. table.concat(items, ",") .. "}"
  end
  return tostring(value)
end

-- Returns the resolved settings: the defaults with the command-line overrides applied. Reading a key
-- that was not declared is an error.
function M.declare(defaults)
  if type(defaults) ~= "table" then
    error("config expects a table of defaults, e.g. config { lr = 1e-3 }", 2)
  end
  if runner.config ~= nil then error("config { ... } was already declared", 2) end
  local resolved, known = {}, sorted_keys(defaults)
  local integers = integer_keys(defaults, 2)
  for _, key in ipairs(known) do
    local value = defaults[key]
    if type(key) ~= "string" or type_description(value) == nil then
      error(string.format("config key '%s': defaults must be numbers, booleans, strings or lists of them",
        tostring(key)), 2)
    end
    resolved[key] = value
  end
  local overridden = {}
  for _, item in ipairs(runner.overrides) do
    local key, text = item:match("^([^=]+)=(.*)$")
    if defaults[key] == nil then
      runner.usage_error(string.format("unknown config key '%s' (known keys: %s)%s", key, table.concat(known, ", "),
        runner._did_you_mean(key, known)))
    end
    if overridden[key] then runner.usage_error(string.format("config key '%s' is given twice", key)) end
    local value = parse_value(defaults[key], text)
    if value ~= nil and integers[key] and value ~= math.floor(value) then value = nil end
    if value == nil then
      runner.usage_error(string.format("bad value '%s' for config key '%s': expected %s (default %s)",
        text, key, integers[key] and "a whole number" or type_description(defaults[key]), format_value(defaults[key])))
    end
    resolved[key] = value
    overridden[key] = true
  end
  if runner._config_wanted then  -- runner --print-config: the declared keys, and nothing of the script runs further
    runner._report_config(defaults, integers)
    os.exit(0)
  end
  local parts = {}
  for _, key in ipairs(known) do
    parts[#parts + 1] = key .. "=" .. format_value(resolved[key]) .. (overridden[key] and "*" or "")
  end
  runner.log.info("config: %s%s", table.concat(parts, " "), next(overridden) and "  (* overridden)" or "")
  runner.config = setmetatable(resolved, {
    __index = function(_, key)
      error(string.format("config has no key '%s' (known keys: %s)%s", tostring(key), table.concat(known, ", "),
        runner._did_you_mean(tostring(key), known)), 2)
    end,
  })
  return runner.config
end

return M
