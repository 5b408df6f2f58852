-- Spec: torch.save / torch.load in the safetensors format, both ways with Python's safetensors.
describe("safetensors", function()
  it("reads what Python's safetensors wrote, every dtype", function()
    local t, metadata = torch.load(test.golden("python_written.safetensors"))
    expect_eq(metadata.written_by, "python safetensors")
    expect_eq(metadata.note, "ünïcode")
    local base = torch.arange(6):reshape(2, 3)
    expect_true(t.float32:equal(base:float() / 4), "float32")
    expect_true(t.float64:equal(base:double() / 8), "float64")
    expect_true(t.float16:equal(base:half() / 2), "float16")
    expect_true(t.bfloat16:equal(base:bfloat16() * 2), "bfloat16")
    expect_true(t.int64:equal(base - 3), "int64")
    expect_true(t.int32:equal(base:int() * 1000), "int32")
    expect_eq(t.int16.dtype, "int16")
    expect_list(t.int16:reshape(-1):tolist(), { -100, -99, -98, -97, -96, -95 })
    expect_list(t.int8:reshape(-1):tolist(), { -5, -4, -3, -2, -1, 0 })
    expect_list(t.uint8:reshape(-1):tolist(), { 250, 251, 252, 253, 254, 255 })
    expect_list(t.bool:reshape(-1):tolist(), { true, false, true, false, true, false })
    expect_eq(t.scalar:dim(), 0)
    expect_eq(t.scalar:item(), 2.5)
    expect_list(t.empty.shape, { 0, 4 })
  end)

  it("round-trips its own files, views and metadata included", function()
    local path = test.tmp .. "/roundtrip.safetensors"
    local source = {
      a = torch.randn(3, 4), b = torch.arange(10):reshape(2, 5):t(), c = torch.ones(2, { dtype = "bfloat16" }),
    }
    torch.save(source, path, { step = 7, kind = "test" })
    local loaded, metadata = torch.load(path)
    for name, tensor in pairs(source) do expect_true(loaded[name]:equal(tensor), name) end
    expect_eq(metadata.step, "7")
  end)

  it("names the path when a file is missing", function()
    expect_error(function() torch.load(test.tmp .. "/missing.safetensors") end, test.tmp .. "/missing.safetensors", true)
  end)
end)
