-- Spec: requires_grad, backward, grad, no-grad scopes.
describe("autograd", function()
  it("computes gradients of a scalar with backward()", function()
    local x = torch.tensor({ 1, 2, 3 }, { requires_grad = true })
    local y = (x * x):sum()
    y:backward()
    expect_list(x.grad:tolist(), { 2, 4, 6 })
    expect_true(x.is_leaf, "x is a leaf")
    expect_true(not y.is_leaf, "y is not a leaf")
  end)

  it("accumulates gradients until they are cleared", function()
    local w = torch.ones(2):requires_grad_()
    for _ = 1, 3 do (w * 2):sum():backward() end
    expect_list(w.grad:tolist(), { 6, 6 })
    w.grad = nil
    expect_eq(w.grad, nil)
  end)

  it("takes an explicit gradient for non-scalar outputs", function()
    local x = torch.ones(2, { requires_grad = true })
    local y = x * 3
    y:backward(torch.tensor({ 1, 10 }))
    expect_list(x.grad:tolist(), { 3, 30 })
  end)

  it("records nothing inside torch.no_grad and restores grad mode after errors", function()
    local x = torch.ones(2, { requires_grad = true })
    local y = torch.no_grad(function() return x * 2 end)
    expect_true(not y.requires_grad, "no graph inside no_grad")
    expect_true(torch.is_grad_enabled(), "grad mode restored")
    local ok = pcall(torch.no_grad, function() error("inside") end)
    expect_true(not ok, "error propagates")
    expect_true(torch.is_grad_enabled(), "grad mode restored after an error")
    expect_eq(select(2, torch.no_grad(function(a, b) return a, b end, 1, 2)), 2)
  end)

  it("detach cuts the graph", function()
    local x = torch.ones(1, { requires_grad = true })
    expect_true(not (x * 2):detach().requires_grad, "detached")
  end)

  it("reports backward on a tensor that does not require grad", function()
    expect_error(function() torch.ones(1):backward() end,
      here(-1) .. "element 0 of tensors does not require grad and does not have a grad_fn")
  end)
end)
