-- Human-readable rendering of Lua values (tables nested, tensors and modules through their tostring).
local M = {}

local function is_identifier(key)
  return type(key) == "string" and key:match("^[%a_][%w_]*$") ~= nil
end

local function render(value, indent, depth, seen)
  local kind = type(value)
  if kind == "string" then return string.format("%q", value) end
  if kind ~= "table" then return tostring(value) end
  local meta = getmetatable(value)
  if meta and meta.__tostring then return tostring(value) end
  if meta and meta.__config_values then value = meta.__config_values end  -- config {}'s proxy: its values
  if seen[value] then return "<cycle>" end
  if depth <= 0 then return "{...}" end
  seen[value] = true
  local items, count = {}, #value
  for i = 1, count do items[#items + 1] = render(value[i], indent .. "  ", depth - 1, seen) end
  local keys = {}
  for k in pairs(value) do
    if not (type(k) == "number" and k >= 1 and k <= count and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local name = is_identifier(k) and k or "[" .. render(k, indent, 0, seen) .. "]"
    items[#items + 1] = name .. " = " .. render(value[k], indent .. "  ", depth - 1, seen)
  end
  seen[value] = nil
  if #items == 0 then return "{}" end
  local flat = "{ " .. table.concat(items, ", ") .. " }"
  if #flat <= 80 and not flat:find("\n") then return flat end
  return "{\n" .. indent .. "  " .. table.concat(items, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end

-- repr(value [, depth = 3])
function M.repr(value, depth)
  return render(value, "", depth or 3, {})
end

-- print(...): each value rendered with repr, separated by tabs.
function M.print(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = M.repr((select(i, ...))) end
  io.write(table.concat(parts, "\t"), "\n")
end

return M
