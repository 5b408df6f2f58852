-- The ---@meta stubs (stdlib/meta/*.lua) read as an index of documented names, for help() at the REPL.
local M = {}

local stub_paths = runner._stub_paths
runner._stub_paths = nil

-- A tag's description may continue on the lines right after it, as `---   more text` (two or more spaces after
-- `---`): the continuation joins the tag's text.
-- An entry: { kind = "function"|"class"|"alias"|"value", name, doc = {lines}, tags = {"@param ...", ...},
--             file, line, signature (functions), parent (classes) }.
local function new_pending()
  return { doc = {}, tags = {}, line = nil }
end

local function doc_text(line)
  local text = line:match("^%-%-%-(.*)$")
  if text == nil or text:sub(1, 1) == "@" or text:sub(1, 1) == "-" then return nil end
  return (text:gsub("^ ", ""))
end

-- Reads one stub file into `index` (name -> entry) and `order` (entries in reading order).
local function read_stub(path, index, order)
  local shown = path:match("(stdlib/meta/[^/]+)$") or path
  local pending = new_pending()
  local class  -- the ---@class being documented, until its table or the next blank line
  local locals = {}  -- `local data = {}` after ---@class runner.data: data.x is runner.data.x
  local function qualified(name)
    local head, rest = name:match("^([%w_]+)([%.:].*)$")
    if head and locals[head] then return locals[head] .. rest end
    return name
  end
  local function add(entry)
    entry.file = shown
    index[entry.name] = entry
    order[#order + 1] = entry
  end
  local number = 0
  local last_tags  -- the list the previous line's tag went into, while a continuation may follow it
  for line in io.lines(path) do
    number = number + 1
    local continuation = last_tags and line:match("^%-%-%-%s%s+(%S.*)$")
    local text = not continuation and doc_text(line)
    local tag = line:match("^%-%-%-(@.*)$")
    local class_name, parent = line:match("^%-%-%-@class%s+([%w_%.]+)%s*:?%s*([%w_%.]*)")
    local alias = line:match("^%-%-%-@alias%s+([%w_%.]+)")
    local function_name, arguments = line:match("^function%s+([%w_%.:]+)%s*(%b())")
    local local_table = line:match("^local%s+([%w_]+)%s*=%s*{}")
    local assigned, value = line:match("^([%w_%.]+)%s*=%s*(.-)%s*$")
    local tags_of_line
    if continuation then
      last_tags[#last_tags] = last_tags[#last_tags] .. " " .. continuation
      tags_of_line = last_tags
    elseif class_name then
      class = { kind = "class", name = class_name, parent = parent ~= "" and parent or nil, doc = pending.doc,
                tags = {}, line = pending.line or number }
      add(class)
      pending = new_pending()
    elseif alias then
      add({ kind = "alias", name = alias, doc = pending.doc, tags = { tag }, line = pending.line or number })
      pending, class = new_pending(), nil
    elseif text then
      if class and #pending.doc == 0 and #pending.tags == 0 then
        class.doc[#class.doc + 1] = text
      else
        pending.line = pending.line or number
        pending.doc[#pending.doc + 1] = text
      end
    elseif tag and tag ~= "@meta" then
      if class and tag:match("^@field") and #pending.doc == 0 then
        class.tags[#class.tags + 1] = tag
        tags_of_line = class.tags
      else
        pending.line = pending.line or number
        pending.tags[#pending.tags + 1] = tag
        tags_of_line = pending.tags
      end
    elseif function_name then
      local name = qualified(function_name)
      add({ kind = "function", name = name, signature = name .. arguments, doc = pending.doc, tags = pending.tags,
            line = pending.line or number })
      pending, class = new_pending(), nil
    elseif local_table then
      if class then locals[local_table] = class.name end
      pending, class = new_pending(), nil
    elseif assigned then
      if class and value == "{}" then
        if assigned ~= class.name then locals[assigned] = class.name end
      elseif #pending.doc > 0 or #pending.tags > 0 then
        add({ kind = value == "{}" and "class" or "value", name = qualified(assigned), doc = pending.doc,
              tags = pending.tags, line = pending.line or number })
      end
      pending, class = new_pending(), nil
    else
      pending, class = new_pending(), nil
    end
    last_tags = tags_of_line
  end
end

local cached

-- The index of every stub: { by_name = {name -> entry}, entries = {...} }, read once.
function M.index()
  if cached then return cached end
  local by_name, entries = {}, {}
  for _, path in ipairs(stub_paths()) do read_stub(path, by_name, entries) end
  cached = { by_name = by_name, entries = entries }
  return cached
end

return M
