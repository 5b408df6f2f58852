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

-- Whether `value` is a value of the default's type, within the key's limits: numbers finite (whole where the
-- default is an integer literal), lists of the default's element type.
local function fits(default, value, integer, limit)
  local function scalar_fits(example, v)
    if type(v) ~= type(example) then return false end
    if type(v) ~= "number" then return true end
    if v ~= v or v == math.huge or v == -math.huge then return false end
    if integer and v ~= math.floor(v) then return false end
    if limit and ((limit.min and v < limit.min) or (limit.max and v > limit.max)) then return false end
    return true
  end
  if type(default) ~= "table" then return scalar_fits(default, value) end
  if type(value) ~= "table" then return false end
  local element = default[1] ~= nil and default[1] or 0
  for i, v in pairs(value) do
    if type(i) ~= "number" or i < 1 or i > #value or not scalar_fits(element, v) then return false end
  end
  return true
end

local function expected(default, integer, limit)
  local text = integer and "a whole number" or type_description(default)
  if limit and limit.min then text = text .. " >= " .. tostring(limit.min) end
  if limit and limit.max then text = text .. (limit.min and " and" or "") .. " <= " .. tostring(limit.max) end
  return text
end

local function format_value(value)
  if type(value) == "table" then
    local items = {}
    for i, v in ipairs(value) do items[i] = tostring(v) end
    return "{" .. table.concat(items, ",") .. "}"
  end
  return tostring(value)
end

local function check_limits(defaults, limits)
  if limits == nil then return {} end
  if type(limits) ~= "table" then
    error("config's second argument is a table of limits, e.g. config({ every = 100 }, { every = { min = 1 } })", 3)
  end
  for key, limit in pairs(limits) do
    local default = defaults[key]
    local number = type(default) == "number" or (type(default) == "table" and type(default[1] or 0) == "number")
    if default == nil or not number then
      error(string.format("config limits: '%s' is not a declared number (or list of numbers)", tostring(key)), 3)
    end
    if type(limit) ~= "table" then
      error(string.format("config limits: '%s' takes { min = N, max = N }, got %s", key, type(limit)), 3)
    end
    for name, bound in pairs(limit) do
      if (name ~= "min" and name ~= "max") or type(bound) ~= "number" then
        error(string.format("config limits: '%s' takes { min = N, max = N }, got %s = %s", key, tostring(name),
          tostring(bound)), 3)
      end
    end
  end
  return limits
end

-- The script's config as a proxy over its values, so that an assignment (in the script or from `runner attach`) is
-- checked as key=value is: reading or writing an undeclared key is an error, and so is a value the key cannot take.
local function config_proxy(values, known, integers, defaults, limits)
  local proxy = {}
  local function unknown(key)
    return string.format("config has no key '%s' (known keys: %s)%s", tostring(key), table.concat(known, ", "),
      runner._did_you_mean(tostring(key), known))
  end
  return setmetatable(proxy, {
    __index = function(_, key)
      local value = values[key]
      if value == nil then error(unknown(key), 2) end
      return value
    end,
    __newindex = function(_, key, value)
      if defaults[key] == nil then error(unknown(key), 2) end
      if not fits(defaults[key], value, integers[key], limits[key]) then
        error(string.format("bad value %s for config key '%s': expected %s (default %s)",
          type(value) == "string" and "'" .. value .. "'" or format_value(value), key,
          expected(defaults[key], integers[key], limits[key]), format_value(defaults[key])), 2)
      end
      values[key] = value
    end,
    __pairs = function() return next, values, nil end,
    __config_values = values,
  })
end

-- values(cfg): the plain table of a config's keys and values, or cfg itself when it is a plain table.
function M.values(cfg)
  local meta = getmetatable(cfg)
  return meta and meta.__config_values or cfg
end

-- Returns the resolved settings: the defaults with the command-line overrides applied. Reading a key
-- that was not declared is an error.
function M.declare(defaults, limits)
  if type(defaults) ~= "table" then
    error("config expects a table of defaults, e.g. config { lr = 1e-3 }", 2)
  end
  if runner.config ~= nil and not runner._load_only then error("config { ... } was already declared", 2) end
  local resolved, known = {}, sorted_keys(defaults)
  local integers = integer_keys(defaults, 2)
  limits = check_limits(defaults, limits)
  for _, key in ipairs(known) do
    local value = defaults[key]
    if type(key) ~= "string" or type_description(value) == nil then
      error(string.format("config key '%s': defaults must be numbers, booleans, strings or lists of them",
        tostring(key)), 2)
    end
    resolved[key] = value
  end
  local overridden = {}
  local loading = runner._load_only  -- runner.load_run: the run's own values, quietly
  if loading then
    for _, key in ipairs(known) do
      if loading.config[key] ~= nil then resolved[key] = loading.config[key] end
    end
    return config_proxy(resolved, known, integers, defaults, limits)
  end
  for _, item in ipairs(runner.overrides) do
    local key, text = item:match("^([^=]+)=(.*)$")
    if defaults[key] == nil then
      runner.usage_error(string.format("unknown config key '%s' (known keys: %s)%s", key, table.concat(known, ", "),
        runner._did_you_mean(key, known)))
    end
    if overridden[key] then runner.usage_error(string.format("config key '%s' is given twice", key)) end
    local value = parse_value(defaults[key], text)
    if value == nil or not fits(defaults[key], value, integers[key], limits[key]) then
      runner.usage_error(string.format("bad value '%s' for config key '%s': expected %s (default %s)",
        text, key, expected(defaults[key], integers[key], limits[key]), format_value(defaults[key])))
    end
    resolved[key] = value
    overridden[key] = true
  end
  if runner._config_wanted() then  -- runner --print-config: the declared keys, and nothing of the script runs further
    runner._report_config(defaults, integers)
    os.exit(0)
  end
  local parts = {}
  for _, key in ipairs(known) do
    parts[#parts + 1] = key .. "=" .. format_value(resolved[key]) .. (overridden[key] and "*" or "")
  end
  runner.log.info("config: %s%s", table.concat(parts, " "), next(overridden) and "  (* overridden)" or "")
  runner.config = config_proxy(resolved, known, integers, defaults, limits)
  return runner.config
end

return M
