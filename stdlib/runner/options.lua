-- Option tables of the stdlib's Lua-level functions: unknown keys are errors that list the known ones.
local options = {}

--- Returns `given` (or {} when nil) after checking that it is a table whose keys are all in `known`
--- (a set); errors are raised at `level` (default: the caller of the function that checks).
function options.check(given, name, known, level)
  level = (level or 2) + 1
  given = given or {}
  if type(given) ~= "table" then error(string.format("%s: expected an options table", name), level) end
  for key in pairs(given) do
    if not known[key] then
      local names = {}
      for k in pairs(known) do names[#names + 1] = k end
      table.sort(names)
      error(string.format("unknown option '%s' to '%s' (known: %s)%s", tostring(key), name, table.concat(names, ", "),
        runner._did_you_mean(tostring(key), names)), level)
    end
  end
  return given
end

return options
