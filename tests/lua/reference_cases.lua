-- Loads the golden cases of the Python reference (tests/reference/make_cases.py) for the specs that compare
-- against it: `local cases = dofile("tests/lua/reference_cases.lua")`.
local cases = {}

cases.dir = os.getenv("RUNNER_REFERENCE_CASES")
if not cases.dir then error("RUNNER_REFERENCE_CASES is not set (ctest runs tests/reference/make_cases.py first)", 2) end

--- The value of a Lua table literal stored in a case file's metadata.
function cases.literal(text)
  return assert(loadstring("return " .. text))()
end

--- tensors, metadata of DIR/<relative path>
function cases.load(relative_path)
  return torch.load(cases.dir .. "/" .. relative_path)
end

--- The built-in model with the weights of DIR/models/<name>.safetensors, in eval mode; also its tensors and
--- metadata. `overrides` (optional) replaces options that change no weights (e.g. { fused = true }).
function cases.model(name, overrides)
  local tensors, meta = cases.load("models/" .. name .. ".safetensors")
  local options = cases.literal(meta.options)
  for key, value in pairs(overrides or {}) do options[key] = value end
  local model = meta.model == "unet" and nn.UNet(options) or nn.DiT(options)
  local state = {}
  for key, value in pairs(tensors) do
    local name_in_model = key:match("^param%.(.*)$")
    if name_in_model then state[name_in_model] = value end
  end
  model:load_state_dict(state)
  model:eval()
  return model, tensors, meta
end

return cases
