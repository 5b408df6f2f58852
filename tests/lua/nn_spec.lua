-- Spec: built-in modules, Lua-defined module trees, state dicts; Conv2d + GroupNorm against PyTorch.
local device = test.device

describe("built-in modules", function()
  it("Linear has PyTorch's parameter names, shapes and forward", function()
    local fc = nn.Linear(4, 3)
    local names = {}
    for name, p in fc:named_parameters() do names[#names + 1] = name .. ":" .. table.concat(p.shape, "x") end
    expect_list(names, { "weight:3x4", "bias:3" })
    -- y = x W^T + b, computed here with Lua numbers (every value is exact in float32)
    local weight = { { 1, 2, 3, 4 }, { 0, -1, 0.5, 2 }, { 0.25, 0, 0, -3 } }
    local bias = { 0.5, -1, 2 }
    local x = { { 1, 0, -1, 2 }, { 0.5, 0.5, 0.5, 0.5 } }
    fc:load_state_dict({ weight = torch.tensor(weight), bias = torch.tensor(bias) })
    local expected, expected_without_bias = {}, {}
    for i, row in ipairs(x) do
      expected[i], expected_without_bias[i] = {}, {}
      for j, w in ipairs(weight) do
        local sum = 0
        for k = 1, 4 do sum = sum + row[k] * w[k] end
        expected[i][j], expected_without_bias[i][j] = sum + bias[j], sum
      end
    end
    local y = fc(torch.tensor(x))
    expect_list(y.shape, { 2, 3 })
    expect_close(y, torch.tensor(expected), 0, 0, "Linear forward")
    expect_close(nn.Linear(4, 3, { bias = false }):load_state_dict({ weight = torch.tensor(weight) })(torch.tensor(x)),
      torch.tensor(expected_without_bias), 0, 0, "Linear forward without bias")
    expect_eq(fc:num_parameters(), 15)
    expect_eq(tostring(fc), "Linear(in_features=4, out_features=3, bias=true)")
    expect_eq(nn.Linear(4, 3, { bias = false }):num_parameters(), 12)
  end)

  it("Conv2d, GroupNorm, LayerNorm, Embedding, Dropout and activations run", function()
    local x = torch.randn(2, 3, 8, 8)
    expect_list(nn.Conv2d(3, 5, 3, { padding = 1 })(x).shape, { 2, 5, 8, 8 })
    expect_list(nn.Conv2d(3, 5, { 3, 1 }, { stride = 2 })(x).shape, { 2, 5, 3, 4 })
    expect_list(nn.GroupNorm(1, 3)(x).shape, { 2, 3, 8, 8 })
    expect_list(nn.LayerNorm(8)(x).shape, { 2, 3, 8, 8 })
    expect_list(nn.Embedding(10, 4)(torch.tensor({ 0, 9 }, { dtype = "int64" })).shape, { 2, 4 })
    for _, make in ipairs({ nn.ReLU, nn.SiLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.Mish, nn.Identity, nn.LeakyReLU }) do
      expect_list(make()(x).shape, { 2, 3, 8, 8 })
    end
    local drop = nn.Dropout(0.5)
    drop:eval()
    expect_true(drop(x):equal(x), "dropout is the identity in eval mode")
    drop:train()
    expect_true(not drop(x):equal(x), "dropout drops in train mode")
  end)

  it("expose their own parameters, buffers and children as fields, the module's own tensors", function()
    local fc = nn.Linear(3, 2)
    expect_list(fc.weight.shape, { 2, 3 })
    expect_list(fc.bias.shape, { 2 })
    expect_eq(fc.nothing, nil)
    fc(torch.ones(1, 3)):sum():backward()
    expect_close(fc.bias.grad, torch.ones(2), 0, 0, "the gradient of the module's own bias")
    local dit = nn.DiT { depth = 2, hidden = 32, heads = 2, patch = 2, image = 8, in_channels = 4, classes = 3 }
    expect_list(dit.pos_embed.shape, { 1, 16, 32 })
    local state = dit:state_dict()
    expect_true(dit.x_embedder.proj.weight:equal(state["x_embedder.proj.weight"]), "a child's parameter")
    expect_true(dit.blocks[2].attn.qkv.bias:equal(state["blocks.1.attn.qkv.bias"]), "blocks[2] is blocks.1, as in Sequential")
    local x = torch.randn(2, 16, 32)
    expect_close(dit.final_layer.linear(x), nn.functional.linear(x, state["final_layer.linear.weight"],
      state["final_layer.linear.bias"]), 0, 0, "a built-in child of a known type runs its forward")
    expect_error(function() dit.x_embedder(x) end,
      here(-1) .. "this Module is a part of a built-in model with no forward of its own in Lua; call the model")
  end)

  it("rejects unknown options", function()
    expect_error(function() nn.Conv2d(3, 5, 3, { pad = 1 }) end,
      here(-1) .. "unknown option 'pad' to 'Conv2d' (known: bias, dilation, groups, padding, padding_mode, stride)")
  end)

  it("Conv2d followed by GroupNorm matches PyTorch forward and backward", function()
    local golden = torch.load(test.golden("conv_groupnorm.safetensors"))
    local conv, norm = nn.Conv2d(4, 6, 3, { padding = 1 }), nn.GroupNorm(3, 6)
    conv:load_state_dict({ weight = golden["conv.weight"], bias = golden["conv.bias"] })
    norm:load_state_dict({ weight = golden["norm.weight"], bias = golden["norm.bias"] })
    conv:to(device)
    norm:to(device)
    local x = golden.x:to(device):requires_grad_()
    local y = norm(conv(x))
    expect_close(y, golden.y, 1e-5, 1e-5, "forward")
    local _ = (y * golden.coefficient:to(device)):sum():backward()
    expect_close(x.grad, golden.grad_x, 1e-4, 1e-5, "grad x")
    local conv_params, norm_params = conv:parameters(), norm:parameters()
    expect_close(conv_params[1].grad, golden["grad.conv.weight"], 1e-4, 1e-5, "grad conv.weight")
    expect_close(conv_params[2].grad, golden["grad.conv.bias"], 1e-4, 1e-5, "grad conv.bias")
    expect_close(norm_params[1].grad, golden["grad.norm.weight"], 1e-4, 1e-5, "grad norm.weight")
    expect_close(norm_params[2].grad, golden["grad.norm.bias"], 1e-4, 1e-5, "grad norm.bias")
  end)
end)

describe("losses", function()
  local g = torch.load(test.golden("losses.safetensors"))
  it("cross_entropy, mse and l1 match PyTorch", function()
    local F = nn.functional
    expect_close(F.cross_entropy(g.logits, g.target), g.cross_entropy, 1e-6, 1e-6, "cross_entropy")
    expect_close(F.cross_entropy(g.logits, g.target, { label_smoothing = 0.1 }), g.cross_entropy_smoothed, 1e-6, 1e-6)
    expect_close(F.cross_entropy(g.logits, g.target, { reduction = "none" }), g.cross_entropy_none, 1e-6, 1e-6)
    expect_close(F.mse_loss(g.prediction, g.reference), g.mse, 1e-6, 1e-6, "mse")
    expect_close(F.mse_loss(g.prediction, g.reference, { reduction = "sum" }), g.mse_sum, 1e-5, 1e-6, "mse sum")
    expect_close(F.l1_loss(g.prediction, g.reference), g.l1, 1e-6, 1e-6, "l1")
    expect_error(function() F.mse_loss(g.prediction, g.reference, { reduction = "avg" }) end,
      here(-1) .. "mse_loss: reduction must be mean, sum or none, got 'avg'")
  end)
end)

describe("Lua-defined modules", function()
  local MLP = nn.Module("MLP")
  function MLP:init(dim, hidden)
    self.fc1 = nn.Linear(dim, hidden)
    self.act = nn.SiLU()
    self.fc2 = nn.Linear(hidden, dim)
    self.scale = nn.Parameter(torch.ones(dim))
    self:register_buffer("calls", torch.zeros(1))
  end
  function MLP:forward(x)
    self.calls:add_(1)
    return self.fc2(self.act(self.fc1(x))) * self.scale
  end

  it("register children, parameters and buffers in order", function()
    local m = MLP(4, 8)
    local names = {}
    for name in m:named_parameters() do names[#names + 1] = name end
    expect_list(names, { "scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" })
    expect_eq(m:num_parameters(), 4 + 32 + 8 + 32 + 4)
    local buffers = {}
    for name in m:named_buffers() do buffers[#buffers + 1] = name end
    expect_list(buffers, { "calls" })
    local children = {}
    for name in m:children() do children[#children + 1] = name end
    expect_list(children, { "fc1", "act", "fc2" })
  end)

  it("forward through __call, with gradients reaching every parameter", function()
    local m = MLP(4, 8)
    m(torch.randn(3, 4)):pow(2):sum():backward()
    for name, p in m:named_parameters() do expect_true(p.grad ~= nil, name .. " has a gradient") end
    expect_eq(m.calls:item(), 1)
  end)

  it("print as a tree", function()
    expect_eq(tostring(MLP(2, 3)), table.concat({
      "MLP(",
      "  (fc1): Linear(in_features=2, out_features=3, bias=true)",
      "  (act): SiLU()",
      "  (fc2): Linear(in_features=3, out_features=2, bias=true)",
      ")",
    }, "\n"))
  end)

  it("switch train/eval recursively", function()
    local m = nn.Sequential(MLP(2, 2), nn.Dropout(0.1))
    m:eval()
    expect_true(not m:is_training(), "sequential eval")
    expect_true(not m[1]:is_training(), "child eval")
    expect_true(not m[2]:is_training(), "native child eval")
    m:train()
    expect_true(m[2]:is_training(), "native child train")
  end)

  it("move to a device keeping parameter identity", function()
    local m = MLP(2, 2)
    local scale = m.scale
    m:to(device)
    expect_true(rawequal(scale, m.scale), "same parameter object")
    expect_eq(m.scale.device, torch.device(device))
    expect_eq(m.fc1:parameters()[1].device, torch.device(device))
    m:to("float64")
    expect_eq(m.scale.dtype, "float64")
  end)

  it("save and load state dicts as safetensors", function()
    local a, b = MLP(3, 5), MLP(3, 5)
    local path = test.tmp .. "/mlp.safetensors"
    a:save(path, { epoch = "3" })
    local metadata = b:load(path)
    expect_eq(metadata.epoch, "3")
    local x = torch.randn(2, 3)
    expect_true(a(x):equal(b(x)), "same outputs after loading")
    local state = a:state_dict()
    expect_list(state["fc1.weight"].shape, { 5, 3 })
    expect_true(state.calls ~= nil, "buffers are in the state dict")
  end)

  it("report missing, unexpected and mismatched keys", function()
    local m = MLP(3, 5)
    local state = m:state_dict()
    state["fc1.bias"] = nil
    state["extra"] = torch.zeros(1)
    state["fc2.bias"] = torch.zeros(7)
    expect_error(function() m:load_state_dict(state) end,
      here(-1) .. "load_state_dict: missing keys: fc1.bias; shape mismatch for fc2.bias: state has [7], module has [3]; unexpected keys: extra")
    state["fc2.bias"] = torch.zeros(3)
    m:load_state_dict(state, { strict = false })
    expect_eq(m.fc2.bias:sum():item(), 0)
    expect_true(m.fc2.bias:equal(m.fc2:parameters()[2]), "the field is the parameter")
  end)

  it("load with the one strict loader: nothing changes unless all fits, and the options are checked", function()
    local m = MLP(3, 5)
    local before = m.fc1.weight:clone()
    local state = m:state_dict()
    for name, tensor in pairs(state) do state[name] = tensor + 1 end
    state["fc2.bias"] = torch.zeros(7)
    expect_error(function() m:load_state_dict(state, { strict = false }) end,
      here(-1) .. "load_state_dict: shape mismatch for fc2.bias: state has [7], module has [3]")
    expect_true(m.fc1.weight:equal(before), "a failed load leaves every tensor as it was")
    expect_error(function() m:load_state_dict(m:state_dict(), { strct = false }) end,
      here(-1) .. "unknown option 'strct' to 'load_state_dict' (known: strict); did you mean 'strict'?")
    expect_error(function() m:load_state_dict({ ["fc1.weight"] = 3 }) end,
      here(-1) .. "load_state_dict: fc1.weight is a number, not a Tensor")
    local path = test.tmp .. "/nn_spec_mlp.safetensors"
    m:save(path)
    expect_error(function() m:load(path, { keys = "ema" }) end,
      here(-1) .. "unknown option 'keys' to 'load' (known: key, strict); did you mean 'key'?")
    MLP(3, 5):load(path, { strict = true })
  end)

  it("refuse to replace a child with a plain value", function()
    local m = MLP(2, 2)
    expect_error(function() m.fc1 = 3 end, here() .. "MLP.fc1 holds a module; assign a module or nn.Parameter, or nil to remove it")
  end)

  it("keep an EMA copy with the trainer's rule: lerp trainable weights, copy frozen ones and buffers", function()
    local ema, model = MLP(3, 4), MLP(3, 4)
    model.fc2:parameters()[2]:requires_grad_(false)
    model.calls:fill_(5)
    local before = {}
    for name, p in ema:named_parameters() do before[name] = p:clone() end
    nn.ema_update(ema, model, 0.75)
    local params = {}
    for name, p in model:named_parameters() do params[name] = p end
    for name, p in ema:named_parameters() do
      local expected = name == "fc2.bias" and params[name] or before[name] * 0.75 + params[name] * 0.25
      expect_close(p, expected, 1e-6, 1e-6, name)
    end
    expect_eq(ema.calls:item(), 5)
    expect_error(function() nn.ema_update(ema, MLP(3, 5), 0.9) end,
      here(-1) .. "nn.ema_update: parameter 2 has shape [4, 3] in the EMA and [5, 3] in the model")
    expect_error(function() nn.ema_update(ema, nn.Linear(3, 4), 0.9) end,
      here(-1) .. "nn.ema_update: the EMA has 5 parameters, the model 2")
    expect_error(function() nn.ema_update(ema, model, 1.5) end, here() .. "nn.ema_update: decay must be in [0, 1]")
  end)

  it("inherit from a parent class", function()
    local Scaled = nn.Module("Scaled", MLP)
    function Scaled:forward(x) return MLP.forward(self, x) * 2 end
    local s = Scaled(2, 4)
    expect_list(s(torch.zeros(1, 2)).shape, { 1, 2 })
    expect_eq(s:num_parameters(), 2 + 8 + 4 + 8 + 2)
  end)
end)

describe("Sequential", function()
  it("applies children in order, names them like PyTorch, indexes from 1", function()
    local seq = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    expect_list(seq(torch.zeros(5, 2)).shape, { 5, 1 })
    local names = {}
    for name in seq:named_parameters() do names[#names + 1] = name end
    expect_list(names, { "0.weight", "0.bias", "2.weight", "2.bias" })
    expect_eq(seq:len(), 3)
    expect_eq(tostring(seq[2]), "ReLU()")
  end)
end)
